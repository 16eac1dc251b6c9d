//! Real kubectl (1.27 and 1.33 binaries, fresh discovery cache) against skiff-server.

use std::process::Stdio;
use std::time::Duration;

use skiff_tests::{Kubectl, TestServer};

const APP: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
  labels: {app: web}
spec:
  replicas: 2
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: httpd
        image: skiff.local/busybox:1
        command: ["httpd", "-f", "-p", "8080"]
        ports:
        - containerPort: 8080
        env:
        - {name: MODE, value: one}
---
apiVersion: v1
kind: Service
metadata:
  name: web
spec:
  type: NodePort
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
"#;

const DAEMONSET: &str = r#"
apiVersion: apps/v1
kind: DaemonSet
metadata:
  name: agent
spec:
  selector:
    matchLabels: {app: agent}
  template:
    metadata:
      labels: {app: agent}
    spec:
      containers:
      - {name: agent, image: "skiff.local/busybox:1"}
"#;

fn json(k: &Kubectl, args: &[&str]) -> serde_json::Value {
    let mut full = args.to_vec();
    full.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&full)).expect("kubectl -o json output")
}

fn walkthrough(minor: u32) {
    let server = TestServer::start();
    let k = server.kubectl(minor);

    // Discovery and OpenAPI-backed commands.
    let resources = k.ok(&["api-resources"]);
    for r in ["deployments", "pods", "services", "endpointslices", "leases", "clusterroles"] {
        assert!(resources.contains(r), "api-resources lacks {r}:\n{resources}");
    }
    let explain = k.ok(&["explain", "deployment.spec.strategy"]);
    assert!(explain.contains("rollingUpdate") || explain.contains("RollingUpdate"), "{explain}");

    // apply twice: create, then a strategic merge patch.
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(APP));
    assert!(
        out.contains("deployment.apps/web created") && out.contains("service/web created"),
        "{out}"
    );
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(APP));
    assert!(out.contains("deployment.apps/web unchanged"), "{out}");
    let changed = APP.replace("value: one", "value: two").replace("replicas: 2", "replicas: 3");
    let out = k.ok_stdin(&["apply", "-f", "-"], Some(&changed));
    assert!(out.contains("deployment.apps/web configured"), "{out}");
    let d = json(&k, &["get", "deployment", "web"]);
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["env"][0]["value"], "two");
    assert_eq!(d["metadata"]["generation"], 2, "spec changed once after creation");
    assert!(
        d["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
            .is_string()
    );

    let svc = json(&k, &["get", "service", "web"]);
    let ip = svc["spec"]["clusterIP"].as_str().expect("clusterIP allocated");
    assert!(ip.starts_with("10."), "clusterIP {ip} from the service range");
    let node_port = svc["spec"]["ports"][0]["nodePort"].as_u64().expect("nodePort allocated");
    assert!((30000..=32767).contains(&node_port));

    // Server-side apply.
    let ssa = APP.replace("name: web", "name: ssa").replace("app: web", "app: ssa");
    let out = k.ok_stdin(&["apply", "--server-side", "-f", "-"], Some(&ssa));
    assert!(out.contains("serverside-applied"), "{out}");
    let out = k.ok_stdin(&["apply", "--server-side", "-f", "-"], Some(&ssa));
    assert!(out.contains("serverside-applied"), "{out}");
    let d = json(&k, &["get", "deployment", "ssa", "--show-managed-fields"]);
    let managers: Vec<&str> = d["metadata"]["managedFields"]
        .as_array()
        .expect("managedFields")
        .iter()
        .filter_map(|m| m["manager"].as_str())
        .collect();
    assert!(managers.contains(&"kubectl"), "managers: {managers:?}");

    // Imperative commands.
    let out =
        k.ok(&["create", "deployment", "cd", "--image=skiff.local/busybox:1", "--replicas=2"]);
    assert!(out.contains("deployment.apps/cd created"), "{out}");
    let out = k.ok(&["create", "configmap", "settings", "--from-literal=a=b"]);
    assert!(out.contains("configmap/settings created"), "{out}");

    // Reads.
    let table = k.ok(&["get", "deployments"]);
    assert!(table.lines().next().unwrap_or("").starts_with("NAME"), "{table}");
    assert!(table.contains("web") && table.contains("cd") && table.contains("ssa"), "{table}");
    let wide = k.ok(&["get", "deployments", "-o", "wide"]);
    assert!(
        wide.contains("CONTAINERS")
            && wide.contains("skiff.local/busybox:1")
            && wide.contains("app=web"),
        "{wide}"
    );
    let all = k.ok(&["get", "services", "-A"]);
    assert!(
        all.contains("NAMESPACE") && all.contains("kubernetes") && all.contains("web"),
        "{all}"
    );
    let labels = k.ok(&["get", "deploy", "web", "--show-labels"]);
    assert!(labels.contains("app=web"), "{labels}");
    let describe = k.ok(&["describe", "deployment", "web"]);
    assert!(
        describe.contains("Name:") && describe.contains("web") && describe.contains("Replicas:"),
        "{describe}"
    );
    let describe = k.ok(&["describe", "service", "web"]);
    assert!(describe.contains(ip), "{describe}");

    // get -w sees a scale as a new row.
    let mut watch = k
        .command(&["get", "deployment", "web", "-w", "--request-timeout=20s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl get -w");
    std::thread::sleep(Duration::from_millis(1500));
    let out = k.ok(&["scale", "deployment", "web", "--replicas=5"]);
    assert!(out.contains("scaled"), "{out}");
    std::thread::sleep(Duration::from_millis(1500));
    let _ = watch.kill();
    let out = watch.wait_with_output().expect("watch output");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.lines().filter(|l| l.starts_with("web")).count() >= 2,
        "watch saw the scale:\n{text}"
    );
    assert!(text.contains("0/5"), "watch shows the new replica count:\n{text}");
    assert_eq!(json(&k, &["get", "deployment", "web"])["spec"]["replicas"], 5);
    // get --subresource=scale prints the Scale's Table.
    let scale = k.ok(&["get", "deployment", "web", "--subresource=scale"]);
    let header: Vec<&str> = scale.lines().next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["NAME", "DESIRED", "AVAILABLE", "AGE"], "{scale}");
    let row: Vec<&str> = scale.lines().nth(1).unwrap_or("").split_whitespace().collect();
    assert_eq!(row[..3], ["web", "5", "0"], "{scale}");

    // Errors are Status objects kubectl prints.
    let err = k.fails(&["get", "deployment", "nope"]);
    assert!(err.contains("deployments.apps \"nope\" not found"), "{err}");
    let err = k.fails(&["create", "deployment", "web", "--image=x"]);
    assert!(err.contains("already exists"), "{err}");

    // Drain: the node is cordoned and its pod evicted through pods/eviction.
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"spare\"}}"),
    );
    let overrides = r#"--overrides={"spec": {"nodeName": "spare"}}"#;
    k.ok(&["run", "lonely", "--image=skiff.local/busybox:1", overrides]);
    let out = k.ok(&["drain", "spare", "--force", "--grace-period=0", "--timeout=30s"]);
    assert!(out.contains("pod/lonely evicted") && out.contains("node/spare drained"), "{out}");
    let err = k.fails(&["get", "pod", "lonely"]);
    assert!(err.contains("pods \"lonely\" not found"), "{err}");
    assert_eq!(json(&k, &["get", "node", "spare"])["spec"]["unschedulable"], true);
    k.ok(&["delete", "node", "spare"]);

    // Delete.
    let out = k.ok(&["delete", "deployment", "web", "cd"]);
    assert!(out.contains("deployment.apps \"web\" deleted"), "{out}");
    let out = k.ok(&["delete", "service", "web"]);
    assert!(out.contains("service \"web\" deleted"), "{out}");
    let left = k.ok(&["get", "deployments", "-o", "name"]);
    assert_eq!(left.trim(), "deployment.apps/ssa");
}

#[test]
fn kubectl_1_27() {
    walkthrough(27);
}

#[test]
fn kubectl_1_33() {
    walkthrough(33);
}

#[test]
fn namespaces_and_validation() {
    let server = TestServer::start();
    let k = server.kubectl(33);
    let ns = k.ok(&["get", "namespaces", "-o", "name"]);
    for want in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(ns.contains(&format!("namespace/{want}")), "{ns}");
    }
    let err = k.fails(&["create", "configmap", "x", "-n", "missing", "--from-literal=a=b"]);
    assert!(err.contains("namespaces \"missing\" not found"), "{err}");
    k.ok(&["create", "namespace", "shop"]);
    k.ok(&["create", "configmap", "x", "-n", "shop", "--from-literal=a=b"]);
    let cms = k.ok(&["get", "cm", "-n", "shop"]);
    assert!(cms.contains('x'), "{cms}");
    // skiff has no ephemeral containers: kubectl debug says so (it read the 404's
    // details, which it dereferences, and crashed on their absence before).
    k.ok(&["run", "p", "-n", "shop", "--image=skiff.local/busybox:1"]);
    let err = k.fails(&["debug", "-n", "shop", "p", "--image=skiff.local/busybox:1", "--", "true"]);
    assert!(err.contains("ephemeral containers are disabled for this cluster"), "{err}");
}

/// `kubectl get componentstatuses`: upstream's columns and deprecation warning. The
/// controller manager is healthy once it holds its Lease; this server runs no scheduler, so
/// nothing holds the scheduler's and it is Unhealthy with the reason; the store answers its
/// readiness check.
#[test]
fn component_statuses() {
    let server = TestServer::start_with_controllers();
    for minor in [27, 33] {
        let k = server.kubectl(minor);
        let mut out = String::new();
        for _ in 0..100 {
            out = k.ok(&["get", "componentstatuses"]);
            if out.contains("controller-manager   Healthy") {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let lines: Vec<Vec<&str>> =
            out.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).collect();
        assert_eq!(lines[0], ["NAME", "STATUS", "MESSAGE", "ERROR"], "{out}");
        assert_eq!(lines[1][..2], ["scheduler", "Unhealthy"], "{out}");
        assert!(out.contains("the kube-system/kube-scheduler Lease does not exist"), "{out}");
        assert_eq!(lines[2], ["controller-manager", "Healthy", "ok"], "{out}");
        assert_eq!(lines[3], ["etcd-0", "Healthy", "ok"], "{out}");
        let run = k.run(&["get", "cs", "etcd-0", "-o", "json"], None);
        assert!(run.status.success());
        let stderr = String::from_utf8_lossy(&run.stderr);
        assert!(stderr.contains("v1 ComponentStatus is deprecated in v1.19+"), "{stderr}");
        let cs: serde_json::Value = serde_json::from_slice(&run.stdout).expect("json");
        assert_eq!(cs["kind"], "ComponentStatus");
        assert_eq!(cs["conditions"][0]["status"], "True");
        let err = k.fails(&["get", "cs", "nope"]);
        assert!(err.contains("componentstatuses \"nope\" not found"), "{err}");
        let err = k.fails(&["delete", "cs", "etcd-0"]);
        assert!(err.contains("does not allow this method"), "{err}");
    }
}

fn quota_pod(name: &str, cpu: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n  containers:\n  \
         - {{name: c, image: skiff.local/busybox:1, resources: {{requests: {{cpu: {cpu}}}}}}}\n"
    )
}

/// ResourceQuota through kubectl: `create quota`, the admission charging each create and
/// refusing what exceeds it with upstream's messages, the table's used/hard columns, and
/// the controller giving back a deleted pod's share.
fn resource_quota(minor: u32) {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(minor);
    k.ok(&["create", "namespace", "q"]);
    k.ok(&["create", "quota", "compute", "-n", "q", "--hard=pods=2,requests.cpu=1,services=1"]);
    // The controller fills in the status (until then, as upstream, the quota restricts
    // nothing).
    let mut quota = serde_json::Value::Null;
    for _ in 0..100 {
        quota = json(&k, &["get", "quota", "compute", "-n", "q"]);
        if quota["status"]["used"]["pods"] == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(quota["status"]["hard"]["requests.cpu"], "1", "{quota}");
    assert_eq!(quota["status"]["used"]["pods"], "0", "{quota}");
    // A compute quota needs every container to state what it counts.
    let err = k.fails(&["run", "bare", "-n", "q", "--image=skiff.local/busybox:1"]);
    assert!(
        err.contains(
            "pods \"bare\" is forbidden: failed quota: compute: must specify requests.cpu"
        ),
        "{err}"
    );
    k.ok_stdin(&["apply", "-n", "q", "-f", "-"], Some(&quota_pod("a", "400m")));
    k.ok_stdin(&["apply", "-n", "q", "-f", "-"], Some(&quota_pod("b", "400m")));
    let out = k.ok(&["get", "quota", "-n", "q"]);
    assert!(out.contains("pods: 2/2, requests.cpu: 800m/1, services: 0/1"), "{out}");
    let out = k.run(&["apply", "-n", "q", "-f", "-"], Some(&quota_pod("c", "100m")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "pods \"c\" is forbidden: exceeded quota: compute, requested: pods=1, used: pods=2, limited: pods=2"
        ),
        "{err}"
    );
    k.ok(&["create", "service", "clusterip", "s1", "-n", "q", "--tcp=80:80"]);
    let err = k.fails(&["create", "service", "clusterip", "s2", "-n", "q", "--tcp=80:80"]);
    assert!(err.contains("exceeded quota: compute, requested: services=1"), "{err}");
    // An update is charged what it adds: a Service turning NodePort takes a node port.
    k.ok(&["create", "quota", "ports", "-n", "q", "--hard=services.nodeports=0"]);
    for _ in 0..100 {
        let quota = json(&k, &["get", "quota", "ports", "-n", "q"]);
        if quota["status"]["used"]["services.nodeports"] == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let err =
        k.fails(&["patch", "service", "s1", "-n", "q", "-p", r#"{"spec":{"type":"NodePort"}}"#]);
    assert!(
        err.contains(
            "services \"s1\" is forbidden: exceeded quota: ports, requested: services.nodeports=1, used: services.nodeports=0, limited: services.nodeports=0"
        ),
        "{err}"
    );
    let svc = json(&k, &["get", "service", "s1", "-n", "q"]);
    assert_eq!(svc["spec"]["type"], "ClusterIP", "{svc}");
    // A deleted pod's share comes back once the controller has recounted.
    k.ok(&["delete", "pod", "a", "-n", "q", "--wait=false"]);
    let mut last = String::new();
    for _ in 0..100 {
        let out = k.run(&["apply", "-n", "q", "-f", "-"], Some(&quota_pod("c", "100m")));
        if out.status.success() {
            last.clear();
            break;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(last.is_empty(), "{last}");
    let quota = json(&k, &["get", "quota", "compute", "-n", "q"]);
    assert_eq!(quota["status"]["used"]["requests.cpu"], "500m", "{quota}");
    // Upstream's validation of the quota itself.
    let err = k.fails(&["create", "quota", "bad", "-n", "q", "--hard=pods=-1,bogus=1"]);
    assert!(
        err.contains(
            "spec.hard[bogus]: Invalid value: \"bogus\": must be a standard resource for quota"
        ),
        "{err}"
    );
    assert!(
        err.contains("spec.hard[pods]: Invalid value: \"-1\": must be greater than or equal to 0"),
        "{err}"
    );
}

const LIMIT_RANGE: &str = r#"
apiVersion: v1
kind: LimitRange
metadata: {name: cpu}
spec:
  limits:
  - type: Container
    max: {cpu: "1"}
    defaultRequest: {cpu: 100m}
"#;

/// LimitRange: defaulted as upstream (the default limit from max), its defaults given to a
/// pod that states nothing (so it passes a compute quota), a container over its max refused.
fn limit_range(minor: u32) {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(minor);
    k.ok(&["create", "namespace", "lr"]);
    k.ok_stdin(&["apply", "-n", "lr", "-f", "-"], Some(LIMIT_RANGE));
    let lr = json(&k, &["get", "limitrange", "cpu", "-n", "lr"]);
    assert_eq!(lr["spec"]["limits"][0]["default"]["cpu"], "1", "{lr}");
    let out = k.ok(&["get", "limits", "-n", "lr"]);
    assert!(out.starts_with("NAME") && out.contains("CREATED AT"), "{out}");
    k.ok(&["create", "quota", "compute", "-n", "lr", "--hard=requests.cpu=1,limits.cpu=2"]);
    let mut quota = serde_json::Value::Null;
    for _ in 0..100 {
        quota = json(&k, &["get", "quota", "compute", "-n", "lr"]);
        if quota["status"]["used"]["requests.cpu"] == "0" {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(quota["status"]["used"]["limits.cpu"], "0", "{quota}");
    k.ok(&["run", "p", "-n", "lr", "--image=skiff.local/busybox:1"]);
    let pod = json(&k, &["get", "pod", "p", "-n", "lr"]);
    let resources = &pod["spec"]["containers"][0]["resources"];
    assert_eq!(resources["requests"]["cpu"], "100m", "{pod}");
    assert_eq!(resources["limits"]["cpu"], "1", "{pod}");
    assert_eq!(
        pod["metadata"]["annotations"]["kubernetes.io/limit-ranger"],
        "LimitRanger plugin set: cpu request for container p; cpu limit for container p"
    );
    let out = k.run(
        &["apply", "-n", "lr", "-f", "-"],
        Some(
            &quota_pod("big", "200m")
                .replace("requests: {cpu: 200m}", "requests: {cpu: 200m}, limits: {cpu: 2}"),
        ),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(
            "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
        ),
        "{err}"
    );
}

#[test]
fn limit_range_1_27() {
    limit_range(27);
}

#[test]
fn limit_range_1_33() {
    limit_range(33);
}

#[test]
fn resource_quota_1_27() {
    resource_quota(27);
}

#[test]
fn resource_quota_1_33() {
    resource_quota(33);
}

/// DaemonSet history through the controllers: each template is a ControllerRevision that
/// `rollout history` lists and `rollout undo` restores.
fn daemonset_history(minor: u32) {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(minor);
    k.ok_stdin(&["apply", "-f", "-"], Some(DAEMONSET));
    // Revisions listed by rollout history, once there are `n`.
    let history = |n: usize| {
        for _ in 0..100 {
            let out = k.ok(&["rollout", "history", "daemonset/agent"]);
            if out.lines().filter(|l| l.starts_with(|c: char| c.is_ascii_digit())).count() == n {
                return out;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("rollout history never listed {n} revisions of the DaemonSet");
    };
    history(1);
    k.ok(&["set", "image", "daemonset/agent", "agent=skiff.local/busybox:2"]);
    let out = history(2);
    assert!(out.contains("REVISION") && out.contains("CHANGE-CAUSE"), "{out}");
    let out = k.ok(&["rollout", "history", "daemonset/agent", "--revision=2"]);
    assert!(out.contains("skiff.local/busybox:2"), "{out}");
    let out = k.ok(&["rollout", "undo", "daemonset/agent"]);
    assert!(out.contains("rolled back"), "{out}");
    let ds = json(&k, &["get", "daemonset", "agent"]);
    assert_eq!(ds["spec"]["template"]["spec"]["containers"][0]["image"], "skiff.local/busybox:1");
    // The first template is revision 3 now. Undoing to it is a no-op kubectl recognises:
    // the revision's data is byte for byte what it computes from the DaemonSet.
    for _ in 0..100 {
        let out = k.ok(&["rollout", "history", "daemonset/agent"]);
        if out.lines().any(|l| l.starts_with("3 ")) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = k.ok(&["rollout", "undo", "daemonset/agent", "--to-revision=3"]);
    assert!(
        out.contains("skipped rollback (current template already matches revision 3)"),
        "{out}"
    );
    k.ok(&["delete", "daemonset", "agent"]);
}

#[test]
fn daemonset_history_kubectl_1_27() {
    daemonset_history(27);
}

#[test]
fn daemonset_history_kubectl_1_33() {
    daemonset_history(33);
}

/// PodDisruptionBudgets through the controllers: `create pdb`, its Table, and a drain the
/// budget holds up (429s kubectl retries) until the budget is relaxed.
fn disruption_budget(minor: u32) {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(minor);
    k.ok_stdin(
        &["apply", "-f", "-"],
        Some("{\"apiVersion\": \"v1\", \"kind\": \"Node\", \"metadata\": {\"name\": \"spare\"}}"),
    );
    let overrides = r#"--overrides={"spec": {"nodeName": "spare"}}"#;
    k.ok(&["run", "guarded", "--image=skiff.local/busybox:1", "--labels=app=guarded", overrides]);
    // What the node's agent would report: the pod runs and is ready.
    let ready =
        r#"{"status": {"phase": "Running", "conditions": [{"type": "Ready", "status": "True"}]}}"#;
    k.ok(&["patch", "pod", "guarded", "--subresource=status", "--type=merge", "-p", ready]);
    let out = k.ok(&["create", "pdb", "guarded", "--selector=app=guarded", "--min-available=1"]);
    assert!(out.contains("poddisruptionbudget.policy/guarded created"), "{out}");
    let counted = |allowed: i64| {
        for _ in 0..100 {
            let pdb = json(&k, &["get", "pdb", "guarded"]);
            let s = &pdb["status"];
            if s["observedGeneration"] == pdb["metadata"]["generation"]
                && s["currentHealthy"] == 1
                && s["disruptionsAllowed"] == allowed
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("the budget never allowed {allowed} disruptions");
    };
    counted(0);
    let table = k.ok(&["get", "pdb"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows[0],
        ["NAME", "MIN", "AVAILABLE", "MAX", "UNAVAILABLE", "ALLOWED", "DISRUPTIONS", "AGE"],
        "{table}"
    );
    assert_eq!(rows[1][..4], ["guarded", "1", "N/A", "0"], "{table}");
    let describe = k.ok(&["describe", "pdb", "guarded"]);
    assert!(
        describe.contains("Min available:  1")
            && describe.contains("Allowed disruptions:  0")
            && describe.contains("Current:              1"),
        "{describe}"
    );

    let err = k.fails(&["drain", "spare", "--force", "--grace-period=0", "--timeout=3s"]);
    assert!(
        err.contains("Cannot evict pod as it would violate the pod's disruption budget."),
        "{err}"
    );
    assert_eq!(json(&k, &["get", "pod", "guarded"])["status"]["phase"], "Running");

    k.ok(&["patch", "pdb", "guarded", "--type=merge", "-p", r#"{"spec": {"minAvailable": 0}}"#]);
    counted(1);
    let out = k.ok(&["drain", "spare", "--force", "--grace-period=0", "--timeout=30s"]);
    assert!(out.contains("pod/guarded evicted") && out.contains("node/spare drained"), "{out}");
}

#[test]
fn disruption_budget_kubectl_1_27() {
    disruption_budget(27);
}

#[test]
fn disruption_budget_kubectl_1_33() {
    disruption_budget(33);
}

/// CronJobs: create, the Table, a Job from one (`create job --from`), and a schedule
/// upstream would refuse.
fn cronjobs(minor: u32) {
    let server = TestServer::start();
    let k = server.kubectl(minor);
    let out = k.ok(&[
        "create",
        "cronjob",
        "tick",
        "--image=skiff.local/busybox:1",
        "--schedule=*/5 * * * *",
        "--",
        "true",
    ]);
    assert!(out.contains("cronjob.batch/tick created"), "{out}");
    let table = k.ok(&["get", "cronjobs"]);
    let rows: Vec<Vec<&str>> = table.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        rows[0],
        ["NAME", "SCHEDULE", "TIMEZONE", "SUSPEND", "ACTIVE", "LAST", "SCHEDULE", "AGE"],
        "{table}"
    );
    assert_eq!(
        rows[1][..9],
        ["tick", "*/5", "*", "*", "*", "*", "<none>", "False", "0"],
        "{table}"
    );
    let cj = json(&k, &["get", "cj", "tick"]);
    assert_eq!(cj["spec"]["concurrencyPolicy"], "Allow", "defaulted");
    assert_eq!(cj["spec"]["successfulJobsHistoryLimit"], 3, "defaulted");

    let out = k.ok(&["create", "job", "by-hand", "--from=cronjob/tick"]);
    assert!(out.contains("job.batch/by-hand created"), "{out}");
    let job = json(&k, &["get", "job", "by-hand"]);
    assert_eq!(job["metadata"]["ownerReferences"][0]["kind"], "CronJob");
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["command"][0], "true");

    let err = k.fails(&[
        "create",
        "cronjob",
        "bad",
        "--image=skiff.local/busybox:1",
        "--schedule=61 * * * *",
    ]);
    assert!(
        err.contains(
            "spec.schedule: Invalid value: \"61 * * * *\": end of range (61) above maximum (59): 61"
        ),
        "{err}"
    );
    let err = k.fails(&[
        "create",
        "cronjob",
        "zoned",
        "--image=skiff.local/busybox:1",
        "--schedule=CRON_TZ=UTC 0 * * * *",
    ]);
    assert!(err.contains("cannot use TZ or CRON_TZ in schedule"), "{err}");
    let explain = k.ok(&["explain", "cronjob.spec.schedule"]);
    assert!(explain.contains("schedule"), "{explain}");
}

#[test]
fn cronjobs_kubectl_1_27() {
    cronjobs(27);
}

#[test]
fn cronjobs_kubectl_1_33() {
    cronjobs(33);
}

const PRUNED_SET: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata: {name: settings, labels: {set: demo}}
data: {mode: one}
---
apiVersion: v1
kind: PersistentVolume
metadata: {name: disk, labels: {set: demo}}
spec:
  capacity: {storage: 2Gi}
  accessModes: [ReadWriteOnce]
  hostPath: {path: /srv/skiff-test-disk}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: data, labels: {set: demo}}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: ReplicationController
metadata: {name: legacy, labels: {set: demo}}
spec:
  replicas: 2
  template:
    metadata: {labels: {app: legacy}}
    spec:
      containers: [{name: c, image: "skiff.local/busybox:1"}]
---
apiVersion: networking.k8s.io/v1
kind: Ingress
metadata: {name: web, labels: {set: demo}}
spec:
  ingressClassName: nginx
  tls: [{hosts: [shop.example.com], secretName: tls}]
  rules:
  - host: shop.example.com
    http:
      paths:
      - {path: /, pathType: Prefix, backend: {service: {name: web, port: {number: 80}}}}
"#;

/// `kubectl apply --prune -l` with kubectl's default allowlist (it maps PVCs, PVs,
/// ReplicationControllers and Ingresses, so every one must be served), the Tables of those
/// kinds, a claim bound by the PersistentVolume binder, and an object left out of the set
/// pruned.
fn apply_prune(minor: u32) {
    let server = TestServer::start_with_controllers();
    let k = server.kubectl(minor);
    let out = k.ok_stdin(&["apply", "--prune", "-l", "set=demo", "-f", "-"], Some(PRUNED_SET));
    for created in [
        "configmap/settings created",
        "persistentvolume/disk created",
        "persistentvolumeclaim/data created",
        "replicationcontroller/legacy created",
        "ingress.networking.k8s.io/web created",
    ] {
        assert!(out.contains(created), "{out}");
    }
    let bound = || {
        let pvc = json(&k, &["get", "pvc", "data"]);
        pvc["status"]["phase"] == "Bound" && pvc["spec"]["volumeName"] == "disk"
    };
    for _ in 0..100 {
        if bound() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(bound(), "the claim was never bound: {}", json(&k, &["get", "pvc", "data"]));
    // StorageObjectInUseProtection: both carry their protection finalizer.
    let finalizers =
        |kind: &str, name: &str| json(&k, &["get", kind, name])["metadata"]["finalizers"].clone();
    assert_eq!(finalizers("pvc", "data"), serde_json::json!(["kubernetes.io/pvc-protection"]));
    assert_eq!(finalizers("pv", "disk"), serde_json::json!(["kubernetes.io/pv-protection"]));
    let rows = |args: &[&str]| -> Vec<Vec<String>> {
        k.ok(args).lines().map(|l| l.split_whitespace().map(str::to_string).collect()).collect()
    };
    let pvc = rows(&["get", "pvc"]);
    assert_eq!(
        pvc[0],
        [
            "NAME",
            "STATUS",
            "VOLUME",
            "CAPACITY",
            "ACCESS",
            "MODES",
            "STORAGECLASS",
            "VOLUMEATTRIBUTESCLASS",
            "AGE"
        ],
        "{pvc:?}"
    );
    assert_eq!(pvc[1][..6], ["data", "Bound", "disk", "2Gi", "RWO", "<unset>"], "{pvc:?}");
    let pv = rows(&["get", "pv"]);
    assert_eq!(pv[1][..6], ["disk", "2Gi", "RWO", "Retain", "Bound", "default/data"], "{pv:?}");
    for _ in 0..100 {
        if json(&k, &["get", "rc", "legacy"])["status"]["replicas"] == 2 {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let rc = rows(&["get", "rc", "-o", "wide"]);
    assert_eq!(
        rc[0],
        ["NAME", "DESIRED", "CURRENT", "READY", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"],
        "{rc:?}"
    );
    assert_eq!(rc[1][..3], ["legacy", "2", "2"], "{rc:?}");
    assert_eq!(rc[1][5..], ["c", "skiff.local/busybox:1", "app=legacy"], "{rc:?}");
    let ing = k.ok(&["get", "ingress", "web"]);
    let ing: Vec<&str> = ing.lines().nth(1).unwrap_or_default().split_whitespace().collect();
    assert_eq!(ing[..5], ["web", "nginx", "shop.example.com", "80,", "443"], "{ing:?}");

    // The set without the ConfigMap and the RC: both pruned, the rest unchanged.
    let smaller: Vec<&str> = PRUNED_SET
        .split("---")
        .filter(|doc| {
            !doc.contains("kind: ConfigMap") && !doc.contains("kind: ReplicationController")
        })
        .collect();
    let out =
        k.ok_stdin(&["apply", "--prune", "-l", "set=demo", "-f", "-"], Some(&smaller.join("---")));
    assert!(out.contains("configmap/settings pruned"), "{out}");
    assert!(out.contains("replicationcontroller/legacy pruned"), "{out}");
    assert!(out.contains("persistentvolumeclaim/data unchanged"), "{out}");
    let err = k.fails(&["get", "rc", "legacy"]);
    assert!(err.contains("NotFound") || err.contains("not found"), "{err}");
    // A claim's spec is fixed once bound (upstream's message).
    let err =
        k.fails(&["patch", "pvc", "data", "-p", r#"{"spec": {"accessModes": ["ReadWriteMany"]}}"#]);
    assert!(err.contains("spec is immutable after creation"), "{err}");
}

#[test]
fn apply_prune_kubectl_1_27() {
    apply_prune(27);
}

#[test]
fn apply_prune_kubectl_1_33() {
    apply_prune(33);
}
