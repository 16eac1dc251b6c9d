//! `--proxy daemonset`: the lab's data plane installed as users install it, from `deploy/`
//! with `kubectl apply -k`, instead of inside each agent.
//!
//! The agents start with `--no-proxy`; every node's containerd has the `skiff/proxy` image
//! (built from the lab's binaries, tagged with the version) imported; the lab writes an
//! overlay of `deploy/proxy` into `<lab dir>/proxy/` with what differs on a machine that
//! holds several nodes (per-node pin dirs and cgroups, the lab's interface, the node's CNI
//! bin dir under the lab dir, the server's lab address), applies it and waits until every
//! node's proxy pod is Ready.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::DaemonSet;

use super::{Error, LabState, Result, cgroup2_dir};

/// Namespace and name of the DaemonSet `deploy/proxy` installs.
pub const NAMESPACE: &str = "kube-system";
pub const DAEMONSET: &str = "skiff-proxy";

/// The kubectl the lab applies manifests with: the newest of the real ones the test suite
/// uses, else the one on `$PATH`.
pub fn kubectl() -> PathBuf {
    let pinned = PathBuf::from("/usr/lib/google-cloud-sdk/bin/kubectl.1.33");
    if pinned.is_file() { pinned } else { PathBuf::from("kubectl") }
}

/// The project's `deploy/` directory (beside this crate).
pub fn default_deploy_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

/// `to` relative to `from` (both absolute): kustomize takes bases by relative path.
fn relative(from: &Path, to: &Path) -> PathBuf {
    let from: Vec<_> = from.components().collect();
    let to: Vec<_> = to.components().collect();
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out = PathBuf::new();
    for _ in common..from.len() {
        out.push("..");
    }
    for c in &to[common..] {
        out.push(c);
    }
    out
}

/// The lab's overlay of `deploy/proxy` (kustomization.yaml's text) for `state`, whose
/// base is at `base` (relative to the overlay's directory).
pub fn overlay(state: &LabState, base: &Path, version: &str) -> String {
    let cgroup_root = cgroup2_dir("");
    let lab = &state.name;
    format!(
        r#"# Written by skiff-lab: deploy/proxy on a machine that holds several nodes.
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
resources:
- {base}
images:
- name: skiff/proxy
  newTag: "{version}"
patches:
- patch: |
    apiVersion: v1
    kind: ConfigMap
    metadata: {{name: skiff-proxy, namespace: kube-system}}
    data:
      api-server-host: "{host}"
      api-server-port: "6443"
      config.yaml: |
        apiVersion: proxy.skiff.dev/v1alpha1
        kind: ProxyConfiguration
        socketLB: true
        mountBPFFS: false
        tcInterfaces: [lab0]
        xdpInterfaces: [lab0]
        nodePortMode: snat
        healthzBindAddress: 0.0.0.0:10256
        metricsBindAddress: 127.0.0.1:10249
- patch: |
    apiVersion: apps/v1
    kind: DaemonSet
    metadata: {{name: skiff-proxy, namespace: kube-system}}
    spec:
      template:
        spec:
          initContainers:
          - name: install-cni
            # The lab directory is mounted whole: each node's bin and conf dirs under it; the
            # node file and IPAM dir are paths on the host, where the plugin runs.
            command:
            - /usr/bin/skiff-cni
            - install
            - --bin-dir=/host/cni/bin/$(NODE_NAME)/containerd/cni/bin
            - --conf-dir=/host/cni/bin/$(NODE_NAME)/containerd/cni/net.d
            - --node-config={dir}/$(NODE_NAME)/{node_file}
            - --data-dir={dir}/$(NODE_NAME)/ipam
            env:
            - name: NODE_NAME
              valueFrom: {{fieldRef: {{fieldPath: spec.nodeName}}}}
          containers:
          - name: skiff-proxy
            args:
            - run
            - --config=/etc/skiff-proxy/config.yaml
            - --hostname-override=$(NODE_NAME)
            - --node-ip=$(NODE_IP)
            - --pin-dir=/sys/fs/bpf/skiff-{lab}-$(NODE_NAME)
            - --cgroup=/run/skiff/cgroupv2/skiff-{lab}-$(NODE_NAME)
          volumes:
          - name: cni-bin
            hostPath: {{path: "{dir}", type: Directory}}
          - name: cni-conf
            hostPath: {{path: "{dir}", type: Directory}}
          - name: cgroup
            hostPath: {{path: "{cgroup}", type: Directory}}
"#,
        base = base.display(),
        host = state.host_ip,
        dir = state.dir.display(),
        node_file = super::CNI_NODE_FILE,
        cgroup = cgroup_root.display(),
    )
}

/// Writes the overlay, applies it with kubectl and waits for every node's proxy.
pub async fn install(state: &LabState, deploy_dir: &Path, timeout: Duration) -> Result<()> {
    let dir = state.dir.join("proxy");
    std::fs::create_dir_all(&dir).map_err(|source| Error::Write { path: dir.clone(), source })?;
    // Both sides resolved: kustomize resolves symlinks in the root it is given.
    let dir = std::fs::canonicalize(&dir).map_err(|source| Error::Write { path: dir, source })?;
    let deploy = std::fs::canonicalize(deploy_dir.join("proxy"))
        .map_err(|source| Error::Write { path: deploy_dir.join("proxy"), source })?;
    let text = overlay(state, &relative(&dir, &deploy), env!("CARGO_PKG_VERSION"));
    let file = dir.join("kustomization.yaml");
    std::fs::write(&file, text).map_err(|source| Error::Write { path: file, source })?;
    apply(state, &dir)?;
    wait_rolled_out(state, timeout).await
}

/// `kubectl apply -k DIR` against the lab.
pub fn apply(state: &LabState, dir: &Path) -> Result<String> {
    super::run(
        std::process::Command::new(kubectl())
            .arg("--kubeconfig")
            .arg(&state.kubeconfig)
            .arg("apply")
            .arg("-k")
            .arg(dir),
    )
}

/// Waits until the proxy DaemonSet has an updated, Ready pod on every node.
pub async fn wait_rolled_out(state: &LabState, timeout: Duration) -> Result<()> {
    let client = super::client(&state.kubeconfig)
        .await
        .map_err(|e| Error::ProxyNotReady { timeout, detail: format!("API client: {e}") })?;
    let api: kube::Api<DaemonSet> = kube::Api::namespaced(client, NAMESPACE);
    let deadline = Instant::now() + timeout;
    loop {
        let detail = match api.get_opt(DAEMONSET).await {
            Ok(Some(ds)) => {
                let generation = ds.metadata.generation.unwrap_or_default();
                let s = ds.status.unwrap_or_default();
                let nodes = state.nodes.len() as i32;
                if s.observed_generation.unwrap_or_default() >= generation
                    && s.desired_number_scheduled == nodes
                    && s.updated_number_scheduled.unwrap_or_default() == nodes
                    && s.number_ready == nodes
                    && s.number_available.unwrap_or_default() == nodes
                {
                    return Ok(());
                }
                format!(
                    "{} of {nodes} nodes ready, {} updated",
                    s.number_ready,
                    s.updated_number_scheduled.unwrap_or_default()
                )
            }
            Ok(None) => "no DaemonSet".into(),
            Err(e) => e.to_string(),
        };
        if Instant::now() > deadline {
            // What the pods say, for whoever reads the error (the lab goes down after it).
            let kubectl = |args: &[&str]| {
                std::process::Command::new(kubectl())
                    .arg("--kubeconfig")
                    .arg(&state.kubeconfig)
                    .arg("--request-timeout=10s")
                    .args(["-n", NAMESPACE])
                    .args(args)
                    .output()
                    .map(|o| {
                        format!(
                            "{}{}",
                            String::from_utf8_lossy(&o.stdout),
                            String::from_utf8_lossy(&o.stderr)
                        )
                    })
                    .unwrap_or_default()
            };
            let pods = kubectl(&["describe", "pods", "-l", "k8s-app=skiff-proxy"]);
            let logs = kubectl(&[
                "logs",
                "-l",
                "k8s-app=skiff-proxy",
                "--all-containers",
                "--prefix",
                "--tail=30",
            ]);
            let detail = format!("{detail}\n{pods}\n{logs}");
            return Err(Error::ProxyNotReady { timeout, detail });
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_found_by_relative_paths() {
        assert_eq!(
            relative(Path::new("/var/lib/skiff/lab/proxy"), Path::new("/work/main/deploy/proxy")),
            PathBuf::from("../../../../../work/main/deploy/proxy")
        );
        assert_eq!(relative(Path::new("/a/b"), Path::new("/a/b/c")), PathBuf::from("c"));
    }

    /// The overlay and the base render with the real kubectl into what the lab needs.
    #[test]
    fn the_overlay_renders_with_kubectl() {
        let dir = tempfile::tempdir().unwrap();
        let state: LabState = serde_json::from_value(serde_json::json!({
            "name": "t1", "dir": dir.path(), "lab_netns": "t1-lab", "subnet": "10.251.0.0/24",
            "host_link": null, "host_ip": "10.251.0.1", "outside_netns": null,
            "outside_ip": "10.251.0.250", "server_data_dir": "/nonexistent",
            "kubeconfig": "/nonexistent", "server": null, "nodes": [], "bin_dir": "/nonexistent",
            "log_filter": "info",
        }))
        .unwrap();
        let overlay_dir = dir.path().join("proxy");
        std::fs::create_dir_all(&overlay_dir).unwrap();
        let base = std::fs::canonicalize(default_deploy_dir().join("proxy")).unwrap();
        std::fs::write(
            overlay_dir.join("kustomization.yaml"),
            overlay(&state, &relative(&overlay_dir, &base), "7.7.7"),
        )
        .unwrap();
        let out = std::process::Command::new(kubectl())
            .arg("kustomize")
            .arg(&overlay_dir)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).expect("kustomize output is YAML");
        let kind = |k: &str| docs.iter().find(|d| d["kind"] == k).unwrap_or_else(|| panic!("{k}"));
        assert_eq!(kind("ConfigMap")["data"]["api-server-host"], "10.251.0.1");
        assert_eq!(kind("ConfigMap")["metadata"]["namespace"], "kube-system");
        let ds = kind("DaemonSet");
        let spec = &ds["spec"]["template"]["spec"];
        assert_eq!(spec["containers"][0]["image"], "skiff/proxy:7.7.7");
        assert_eq!(spec["initContainers"][0]["image"], "skiff/proxy:7.7.7");
        let args: Vec<&str> = spec["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .map(|a| a.as_str().unwrap())
            .collect();
        assert!(args.contains(&"--pin-dir=/sys/fs/bpf/skiff-t1-$(NODE_NAME)"), "{args:?}");
        let mounts = spec["initContainers"][0]["volumeMounts"].as_array().unwrap();
        assert_eq!(mounts.len(), 2, "{mounts:?}");
        for name in ["cni-bin", "cni-conf"] {
            let v = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == name);
            assert_eq!(v.unwrap()["hostPath"]["path"], dir.path().to_string_lossy().as_ref());
        }
        let install = spec["initContainers"][0]["command"].as_array().unwrap();
        let node_file =
            format!("--node-config={}/$(NODE_NAME)/cni-node.json", dir.path().display());
        assert!(install.iter().any(|a| a == &node_file), "{install:?}");
        assert!(
            install
                .iter()
                .any(|a| a == "--conf-dir=/host/cni/bin/$(NODE_NAME)/containerd/cni/net.d"),
            "{install:?}"
        );
        for k in ["ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
            kind(k);
        }
    }
}
