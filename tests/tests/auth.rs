//! Authentication and authorization end to end with real kubectl (1.33 and 1.27): separate
//! kubeconfigs for the admin, a user bound to `view` in one namespace, nodes, a service
//! account, a static token, anonymous clients and a joining agent.

use std::path::Path;

use skiff_apiserver::authn::serviceaccount::{self, Claims, KubernetesClaims, ObjectRef};
use skiff_control_plane::server::ServerConfig;
use skiff_tests::{Kubectl, TestServer};

fn start() -> TestServer {
    let dir = tempfile::tempdir().expect("temp dir");
    let tokens = dir.path().join("tokens.csv");
    std::fs::write(&tokens, "static-secret-token,static-user,1001,\"devs,qa\"\n")
        .expect("token file");
    let mut config = ServerConfig {
        data_dir: dir.path().to_path_buf(),
        listen: "127.0.0.1:0".parse().expect("addr"),
        ..Default::default()
    };
    config.auth.token_auth_file = Some(tokens);
    TestServer::start_with(dir, config)
}

fn stdout(k: &Kubectl, args: &[&str]) -> (bool, String, String) {
    let out = k.run(args, None);
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_string(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_forbidden(k: &Kubectl, args: &[&str], message: &str) {
    let err = k.fails(args);
    // kubectl prints "Error from server (Forbidden): <message>", or for some commands
    // "error: failed to create deployment: <message>".
    assert!(
        (err.contains("(Forbidden)") || err.contains(" is forbidden: ")) && err.contains(message),
        "{args:?}: expected Forbidden with {message:?}, got: {err}"
    );
}

fn assert_unauthorized(k: &Kubectl, args: &[&str]) {
    let err = k.fails(args);
    // client-go reports a 401 as "You must be logged in to the server (<message>)".
    assert!(
        err.contains("You must be logged in to the server"),
        "{args:?}: expected Unauthorized, got: {err}"
    );
}

fn can_i(k: &Kubectl, args: &[&str]) -> String {
    let mut full = vec!["auth", "can-i"];
    full.extend_from_slice(args);
    let (_, out, err) = stdout(k, &full);
    // "yes", "no", or "no - <reason>".
    let answer = out.split_whitespace().next().unwrap_or_default().to_string();
    assert!(answer == "yes" || answer == "no", "auth can-i {args:?}: {out:?} {err}");
    answer
}

const OBJECTS: &str = r#"
apiVersion: v1
kind: Namespace
metadata: {name: team}
---
apiVersion: v1
kind: Namespace
metadata: {name: other}
---
apiVersion: v1
kind: Node
metadata: {name: n1}
---
apiVersion: v1
kind: Node
metadata: {name: n2}
---
apiVersion: v1
kind: Secret
metadata: {name: s1, namespace: team}
stringData: {k: v}
---
apiVersion: v1
kind: Secret
metadata: {name: s2, namespace: team}
stringData: {k: v}
---
apiVersion: v1
kind: Pod
metadata: {name: p1, namespace: team}
spec:
  nodeName: n1
  containers:
  - name: c
    image: busybox
    env:
    - name: X
      valueFrom: {secretKeyRef: {name: s1, key: k}}
---
apiVersion: v1
kind: Pod
metadata: {name: p2, namespace: team}
spec:
  nodeName: n2
  containers: [{name: c, image: busybox}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: viewer-view, namespace: team}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}
subjects: [{apiGroup: rbac.authorization.k8s.io, kind: User, name: viewer}]
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: robot, namespace: team}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: robot-edit, namespace: team}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}
subjects: [{kind: ServiceAccount, name: robot, namespace: team}]
"#;

fn scenario(minor: u32) {
    let server = start();
    let admin = server.kubectl(minor);
    admin.ok_stdin(&["apply", "-f", "-"], Some(OBJECTS));

    // The admin (system:masters) can do everything, and impersonate.
    assert_eq!(can_i(&admin, &["delete", "nodes"]), "yes");
    admin.ok(&["get", "pods", "-n", "team", "--as", "viewer"]);
    assert_forbidden(
        &admin,
        &["get", "pods", "-n", "other", "--as", "viewer"],
        r#"pods is forbidden: User "viewer" cannot list resource "pods" in API group "" in the namespace "other""#,
    );

    // A user bound to `view` in `team` (client certificate from the cluster CA).
    let viewer =
        Kubectl::new(minor, &server.cert_kubeconfig("viewer.kubeconfig", "viewer", &["viewers"]));
    let pods = viewer.ok(&["get", "pods", "-n", "team", "-o", "name"]);
    assert!(pods.contains("pod/p1") && pods.contains("pod/p2"), "{pods}");
    viewer.ok(&["get", "pod", "p1", "-n", "team"]);
    viewer.ok(&["get", "serviceaccounts,configmaps,services", "-n", "team"]);
    assert_forbidden(
        &viewer,
        &["get", "pods", "-n", "other"],
        r#"pods is forbidden: User "viewer" cannot list resource "pods" in API group "" in the namespace "other""#,
    );
    assert_forbidden(
        &viewer,
        &["delete", "pod", "p1", "-n", "team"],
        r#"pods "p1" is forbidden: User "viewer" cannot delete resource "pods" in API group "" in the namespace "team""#,
    );
    assert_forbidden(
        &viewer,
        &["get", "secrets", "-n", "team"],
        r#"secrets is forbidden: User "viewer" cannot list resource "secrets" in API group "" in the namespace "team""#,
    );
    assert_forbidden(
        &viewer,
        &["get", "nodes"],
        r#"nodes is forbidden: User "viewer" cannot list resource "nodes" in API group "" at the cluster scope"#,
    );
    assert_forbidden(
        &viewer,
        &["create", "deployment", "d", "--image", "busybox", "-n", "team"],
        r#"deployments.apps is forbidden: User "viewer" cannot create resource "deployments" in API group "apps" in the namespace "team""#,
    );
    let whoami = viewer.ok(&["auth", "whoami", "-o", "json"]);
    let whoami: serde_json::Value = serde_json::from_str(&whoami).expect("whoami JSON");
    assert_eq!(whoami["status"]["userInfo"]["username"], "viewer", "{whoami}");
    let groups = whoami["status"]["userInfo"]["groups"].to_string();
    assert!(groups.contains("viewers") && groups.contains("system:authenticated"), "{groups}");
    assert_eq!(can_i(&viewer, &["create", "pods", "--subresource", "exec", "-n", "team"]), "no");
    assert_eq!(can_i(&viewer, &["list", "pods", "-n", "team"]), "yes");
    assert_eq!(can_i(&viewer, &["get", "pods", "--subresource", "log", "-n", "team"]), "yes");
    assert_eq!(can_i(&viewer, &["delete", "pods", "-n", "team"]), "no");
    assert_eq!(can_i(&viewer, &["list", "pods", "-n", "other"]), "no");
    assert_forbidden(
        &viewer,
        &["get", "pods", "-n", "team", "--as", "admin"],
        r#"users "admin" is forbidden: User "viewer" cannot impersonate resource "users" in API group "" at the cluster scope"#,
    );

    // A static token (--token-auth-file): authenticated, no bindings until its group gets one.
    let static_user = Kubectl::new(
        minor,
        &server.token_kubeconfig("static.kubeconfig", Some("static-secret-token"), None),
    );
    assert_forbidden(
        &static_user,
        &["get", "pods", "-n", "team"],
        r#"User "static-user" cannot list"#,
    );
    admin.ok(&[
        "create",
        "clusterrolebinding",
        "devs-view",
        "--clusterrole",
        "view",
        "--group",
        "devs",
    ]);
    wait_until(|| static_user.run(&["get", "pods", "-n", "other"], None).status.success());
    assert_unauthorized(
        &Kubectl::new(minor, &server.token_kubeconfig("bad.kubeconfig", Some("not-a-token"), None)),
        &["get", "pods"],
    );

    // Anonymous (kube-rs: kubectl prompts for a user name when a kubeconfig has none):
    // only health and version.
    anonymous_requests(&server.token_kubeconfig("anon.kubeconfig", None, None));

    // A node: reads what its pods need, writes only its own Node and its pods' status.
    let n1 = Kubectl::new(
        minor,
        &server.cert_kubeconfig("n1.kubeconfig", "system:node:n1", &["system:nodes"]),
    );
    n1.ok(&["get", "nodes"]);
    n1.ok(&["get", "pod", "p1", "-n", "team"]);
    // Reading pods is open to nodes, as upstream's NodeRules (the agent's DNS watches all).
    n1.ok(&["get", "pod", "p2", "-n", "team"]);
    n1.ok(&["get", "pods", "-A", "--field-selector", "spec.nodeName=n1"]);
    n1.ok(&["get", "secret", "s1", "-n", "team"]);
    node_reads_only_its_bound_volumes(&admin, &n1);
    n1.ok(&["label", "node", "n1", "ready=yes"]);
    assert_forbidden(
        &n1,
        &["label", "node", "n2", "ready=yes"],
        r#"nodes "n2" is forbidden: User "system:node:n1" cannot patch resource "nodes""#,
    );
    assert_forbidden(
        &n1,
        &["delete", "node", "n2"],
        r#"User "system:node:n1" cannot delete resource "nodes""#,
    );
    assert_forbidden(
        &n1,
        &["delete", "pod", "p2", "-n", "team"],
        r#"pods "p2" is forbidden: User "system:node:n1" cannot delete resource "pods""#,
    );
    assert_forbidden(
        &n1,
        &["annotate", "pod", "p2", "-n", "team", "x=y"],
        r#"pods "p2" is forbidden: User "system:node:n1" cannot"#,
    );
    assert_forbidden(&n1, &["get", "secret", "s2", "-n", "team"], "no relationship found");
    assert_forbidden(
        &n1,
        &["create", "namespace", "n1-ns"],
        r#"User "system:node:n1" cannot create resource "namespaces""#,
    );
    // Its pods' status: allowed for p1, not for p2.
    let status_patch = r#"{"status":{"message":"from n1"}}"#;
    n1.ok(&[
        "patch",
        "pod",
        "p1",
        "-n",
        "team",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        status_patch,
    ]);
    assert_forbidden(
        &n1,
        &[
            "patch",
            "pod",
            "p2",
            "-n",
            "team",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            status_patch,
        ],
        r#"pods "p2" is forbidden: User "system:node:n1" cannot get resource "pods/status" in API group "" in the namespace "team": no relationship found between node 'n1' and this object"#,
    );

    // A service account token from the TokenRequest API (kubectl create token).
    let token = admin.ok(&["create", "token", "robot", "-n", "team"]).trim().to_string();
    let robot =
        Kubectl::new(minor, &server.token_kubeconfig("robot.kubeconfig", Some(&token), None));
    robot.ok(&["get", "pods", "-n", "team"]);
    robot.ok(&["create", "configmap", "from-robot", "-n", "team", "--from-literal", "a=b"]);
    assert_forbidden(
        &robot,
        &["get", "pods", "-n", "other"],
        r#"User "system:serviceaccount:team:robot" cannot list resource "pods" in API group "" in the namespace "other""#,
    );
    // Expired, foreign-signed and tampered tokens are refused.
    let pki = server.pki();
    let sa_uid = admin.ok(&["get", "sa", "robot", "-n", "team", "-o", "jsonpath={.metadata.uid}"]);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("clock")
        .as_secs() as i64;
    let claims = |exp: i64| Claims {
        iss: "https://kubernetes.default.svc.cluster.local".into(),
        sub: "system:serviceaccount:team:robot".into(),
        aud: vec!["https://kubernetes.default.svc.cluster.local".into()],
        exp,
        nbf: now - 7200,
        iat: now - 7200,
        jti: "test".into(),
        kubernetes: KubernetesClaims {
            namespace: "team".into(),
            serviceaccount: ObjectRef { name: "robot".into(), uid: sa_uid.clone() },
            pod: None,
        },
    };
    let valid = serviceaccount::sign_with(&pki.sa_key_pem, &claims(now + 3600)).expect("sign");
    let expired = serviceaccount::sign_with(&pki.sa_key_pem, &claims(now - 60)).expect("sign");
    let foreign = serviceaccount::sign_with(&pki.ca_key_pem, &claims(now + 3600)).expect("sign");
    let mut tampered = valid.clone();
    tampered.insert_str(tampered.find('.').expect("jwt") + 1, "eyJ4IjoxfQ");
    Kubectl::new(minor, &server.token_kubeconfig("valid.kubeconfig", Some(&valid), None))
        .ok(&["get", "pods", "-n", "team"]);
    for (name, t) in [("expired", &expired), ("foreign", &foreign), ("tampered", &tampered)] {
        let k = Kubectl::new(
            minor,
            &server.token_kubeconfig(&format!("{name}.kubeconfig"), Some(t), None),
        );
        assert_unauthorized(&k, &["get", "pods", "-n", "team"]);
    }
    // Recreating the ServiceAccount invalidates its tokens (uid check).
    admin.ok(&["delete", "sa", "robot", "-n", "team"]);
    admin.ok(&["create", "sa", "robot", "-n", "team"]);
    wait_until(|| !robot.run(&["get", "pods", "-n", "team"], None).status.success());
    assert_unauthorized(&robot, &["get", "pods", "-n", "team"]);

    // TLS: a client trusting another CA fails the handshake.
    let wrong_ca = Kubectl::new(
        minor,
        &server.token_kubeconfig(
            "wrong-ca.kubeconfig",
            Some("static-secret-token"),
            Some(&pki.admin_cert_pem),
        ),
    );
    let err = wrong_ca.fails(&["get", "pods"]);
    assert!(err.contains("x509") || err.contains("certificate"), "{err}");
}

/// A node may read the PersistentVolume bound to a claim its pod uses, where both halves
/// of the binding agree (the volume's claimRef names the claim's uid), and not a volume a
/// claim merely names in `volumeName` (which any claim's author may set).
fn node_reads_only_its_bound_volumes(admin: &Kubectl, n1: &Kubectl) {
    let claims = r#"
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: mine, namespace: team}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: vol-mine
  resources: {requests: {storage: 1Gi}}
---
apiVersion: v1
kind: PersistentVolumeClaim
metadata: {name: greedy, namespace: team}
spec:
  accessModes: [ReadWriteOnce]
  storageClassName: ""
  volumeName: vol-other
  resources: {requests: {storage: 1Gi}}
"#;
    admin.ok_stdin(&["apply", "-f", "-"], Some(claims));
    let uid = admin.ok(&["get", "pvc", "mine", "-n", "team", "-o", "jsonpath={.metadata.uid}"]);
    let volumes = format!(
        r#"
apiVersion: v1
kind: PersistentVolume
metadata: {{name: vol-mine}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  hostPath: {{path: /srv/mine}}
  claimRef: {{namespace: team, name: mine, uid: "{uid}"}}
---
apiVersion: v1
kind: PersistentVolume
metadata: {{name: vol-other}}
spec:
  capacity: {{storage: 1Gi}}
  accessModes: [ReadWriteOnce]
  hostPath: {{path: /srv/other-tenant}}
  claimRef: {{namespace: elsewhere, name: data, uid: "0000"}}
---
apiVersion: v1
kind: Pod
metadata: {{name: p3, namespace: team}}
spec:
  nodeName: n1
  containers: [{{name: c, image: busybox}}]
  volumes:
  - {{name: a, persistentVolumeClaim: {{claimName: mine}}}}
  - {{name: b, persistentVolumeClaim: {{claimName: greedy}}}}
"#
    );
    admin.ok_stdin(&["apply", "-f", "-"], Some(&volumes));
    n1.ok(&["get", "pv", "vol-mine"]);
    assert_forbidden(n1, &["get", "pv", "vol-other"], "no relationship found");
    // Another node's pods do not use the claim.
    assert_forbidden(
        admin,
        &["get", "pv", "vol-mine", "--as", "system:node:n2", "--as-group", "system:nodes"],
        "no relationship found",
    );
}

fn anonymous_requests(kubeconfig: &Path) {
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig).expect("kubeconfig");
        let config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
            .await
            .expect("client config");
        let client = kube::Client::try_from(config).expect("client");
        let get = |path: &str| http::Request::get(path).body(Vec::new()).expect("request");
        for path in ["/healthz", "/livez", "/readyz", "/version"] {
            client.request_text(get(path)).await.unwrap_or_else(|e| panic!("{path}: {e}"));
        }
        let code = |r: Result<String, kube::Error>| match r {
            Err(kube::Error::Api(s)) => s.code,
            other => panic!("expected an API error, got {other:?}"),
        };
        assert_eq!(code(client.request_text(get("/api/v1/namespaces/team/pods")).await), 401);
        assert_eq!(code(client.request_text(get("/apis")).await), 401);
        assert_eq!(code(client.request_text(get("/metrics")).await), 401);
        let create = http::Request::post("/api/v1/namespaces")
            .header("content-type", "application/json")
            .body(br#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"anon"}}"#.to_vec())
            .expect("request");
        assert_eq!(code(client.request_text(create).await), 401);
        let delete = http::Request::delete("/api/v1/namespaces/team/pods/p1")
            .body(Vec::new())
            .expect("request");
        assert_eq!(code(client.request_text(delete).await), 401);
    });
}

fn wait_until(mut f: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "condition not reached within 10 s");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

#[test]
fn kubectl_1_33() {
    scenario(33);
}

#[test]
fn kubectl_1_27() {
    scenario(27);
}

/// A join token: good for one node certificate and nothing else.
#[test]
fn join_token_single_use() {
    let server = start();
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let token = rt
        .block_on(skiff_core::join::create_token(
            &server.kubeconfig,
            std::time::Duration::from_secs(600),
        ))
        .expect("creating a join token");
    // A second token does not take the first one's signature away.
    let second = rt
        .block_on(skiff_core::join::create_token(
            &server.kubeconfig,
            std::time::Duration::from_secs(600),
        ))
        .expect("creating a second join token");
    // The token alone reads nothing.
    let as_token =
        Kubectl::new(33, &server.token_kubeconfig("join.kubeconfig", Some(&token), None));
    let id = token.split('.').next().expect("id");
    assert_forbidden(
        &as_token,
        &["get", "pods", "-A"],
        &format!(r#"User "system:bootstrap:{id}" cannot list resource "pods""#),
    );
    assert_forbidden(
        &as_token,
        &["create", "namespace", "x"],
        "cannot create resource \"namespaces\"",
    );
    // Joining yields a node identity.
    let dir = tempfile::tempdir().expect("temp dir");
    let kubeconfig = rt
        .block_on(skiff_core::join::bootstrap(&server.url(), &token, "n3", dir.path()))
        .expect("joining with the token");
    let node = Kubectl::new(33, &kubeconfig);
    node.ok(&["get", "nodes"]);
    // The request is stored, approved and issued, by the token's user.
    let listed = server.kubectl(33).ok(&["get", "csr", "--no-headers"]);
    let row = listed.lines().find(|l| l.contains(&format!("system:bootstrap:{id}")));
    assert!(
        row.is_some_and(|r| r.starts_with("node-csr-") && r.contains("Approved,Issued")),
        "{listed}"
    );
    assert_eq!(can_i(&node, &["create", "namespaces"]), "no");
    assert_eq!(can_i(&node, &["patch", "nodes/n3"]), "yes");
    assert_eq!(can_i(&node, &["patch", "nodes/n1"]), "no");
    // ...once.
    let again = rt.block_on(skiff_core::join::bootstrap(
        &server.url(),
        &token,
        "n4",
        &dir.path().join("again"),
    ));
    assert!(again.is_err(), "a join token was accepted twice");
    wait_until(|| {
        String::from_utf8_lossy(&as_token.run(&["get", "pods", "-A"], None).stderr)
            .contains("Unauthorized")
    });
    assert_unauthorized(&as_token, &["get", "pods", "-A"]);
    assert!(!Path::new(&dir.path().join("again/kubelet.kubeconfig")).exists());
    rt.block_on(skiff_core::join::bootstrap(&server.url(), &second, "n4", &dir.path().join("n4")))
        .expect("joining with the second token");
}

/// A CertificateSigningRequest object for `pem` (signer, usages, optional lifetime).
fn csr_yaml(name: &str, pem: &str, signer: &str, usages: &[&str], seconds: Option<u32>) -> String {
    use base64::Engine;
    let request = base64::engine::general_purpose::STANDARD.encode(pem.as_bytes());
    let expiration = seconds.map(|s| format!("\n  expirationSeconds: {s}")).unwrap_or_default();
    format!(
        "apiVersion: certificates.k8s.io/v1\nkind: CertificateSigningRequest\nmetadata: {{name: {name}}}\nspec:\n  request: {request}\n  signerName: {signer}\n  usages: [{}]{expiration}\n",
        usages.iter().map(|u| format!("{u:?}")).collect::<Vec<_>>().join(", ")
    )
}

/// The certificates.k8s.io/v1 API with real kubectl and the controllers running: a user's
/// request is stored pending with the requester stamped in, `kubectl certificate approve`
/// by an admin gets it signed by the signing controller and the certificate authenticates;
/// approving needs `approve` on the signer; system:masters through kube-apiserver-client,
/// malformed requests and short lifetimes are refused with upstream's messages; a node's
/// request for its own certificate is approved and signed by the controllers, another's
/// is not.
#[test]
fn certificate_signing_requests() {
    use skiff_core::certificates as certs;
    let server = TestServer::start_with_controllers();
    let admin = server.kubectl(33);
    // alice may create and read requests, and write their approval, but approve nothing.
    admin.ok(&[
        "create",
        "clusterrole",
        "csr-user",
        "--verb=create,get,list,watch",
        "--resource=certificatesigningrequests",
    ]);
    admin.ok(&[
        "create",
        "clusterrole",
        "csr-approval",
        "--verb=get,update,patch",
        "--resource=certificatesigningrequests/approval",
    ]);
    admin.ok(&[
        "create",
        "clusterrolebinding",
        "alice-csr",
        "--clusterrole=csr-user",
        "--user=alice",
    ]);
    admin.ok(&[
        "create",
        "clusterrolebinding",
        "alice-approval",
        "--clusterrole=csr-approval",
        "--user=alice",
    ]);
    let alice = Kubectl::new(33, &server.cert_kubeconfig("alice.kubeconfig", "alice", &["devs"]));

    let (pem, key) = certs::new_request("alice", "devs", &[], &[]).expect("request");
    let yaml = csr_yaml(
        "alice-1",
        &pem,
        certs::KUBE_APISERVER_CLIENT,
        &["client auth", "digital signature"],
        Some(3600),
    );
    alice.ok_stdin(&["create", "-f", "-"], Some(&yaml));
    let table = admin.ok(&["get", "csr", "alice-1"]);
    assert!(
        table.contains("SIGNERNAME")
            && table.contains("REQUESTOR")
            && table.contains("REQUESTEDDURATION"),
        "{table}"
    );
    let row = table.lines().nth(1).unwrap_or_default().to_string();
    for want in ["alice-1", "kubernetes.io/kube-apiserver-client", "alice", "60m", "Pending"] {
        assert!(row.contains(want), "{want} in {row}");
    }
    let groups = admin.ok(&["get", "csr", "alice-1", "-o", "jsonpath={.spec.groups}"]);
    assert!(groups.contains("devs") && groups.contains("system:authenticated"), "{groups}");
    // Approving needs `approve` on signers/kubernetes.io/kube-apiserver-client.
    assert_forbidden(
        &alice,
        &["certificate", "approve", "alice-1"],
        "user not permitted to approve requests with signerName \"kubernetes.io/kube-apiserver-client\"",
    );
    admin.ok(&["certificate", "approve", "alice-1"]);
    wait_until(|| {
        admin
            .run(&["get", "csr", "alice-1"], None)
            .stdout
            .windows(15)
            .any(|w| w == b"Approved,Issued")
    });
    let cert_b64 = admin.ok(&["get", "csr", "alice-1", "-o", "jsonpath={.status.certificate}"]);
    use base64::Engine;
    let cert = String::from_utf8(
        base64::engine::general_purpose::STANDARD.decode(cert_b64.trim()).expect("base64"),
    )
    .expect("PEM");
    let (not_before, not_after) = certs::validity(&cert).expect("a certificate");
    let lifetime = not_after.duration_since(not_before).expect("ordered").as_secs();
    assert_eq!(lifetime, 3600 + 300, "expirationSeconds is honoured (plus the backdating)");
    // The signed certificate authenticates as alice, in her groups.
    let issued = server.dir.path().join("alice-issued.kubeconfig");
    std::fs::write(&issued, server.pki().kubeconfig(&server.url(), "alice", &cert, &key))
        .expect("kubeconfig");
    let whoami =
        Kubectl::new(33, &issued).ok(&["auth", "whoami", "-o", "jsonpath={.status.userInfo}"]);
    assert!(whoami.contains("\"username\":\"alice\"") && whoami.contains("devs"), "{whoami}");
    // An approval stays: replacing it with a denial is refused.
    let err = alice.fails(&[
        "patch",
        "csr",
        "alice-1",
        "--subresource=approval",
        "--type=merge",
        "-p",
        r#"{"status":{"conditions":[{"type":"Denied","status":"True","reason":"No"}]}}"#,
    ]);
    assert!(err.contains("updates may not remove a condition of type \"Approved\""), "{err}");

    // Denied requests are never signed.
    let (pem2, _) = certs::new_request("alice", "devs", &[], &[]).expect("request");
    alice.ok_stdin(
        &["create", "-f", "-"],
        Some(&csr_yaml("alice-2", &pem2, certs::KUBE_APISERVER_CLIENT, &["client auth"], None)),
    );
    admin.ok(&["certificate", "deny", "alice-2"]);
    let row = admin.ok(&["get", "csr", "alice-2", "--no-headers"]);
    assert!(row.contains("Denied") && row.contains("<none>"), "{row}");

    // CertificateSubjectRestriction.
    let (masters, _) = certs::new_request("mallory", "system:masters", &[], &[]).expect("request");
    let out = alice.run(
        &["create", "-f", "-"],
        Some(&csr_yaml("mallory", &masters, certs::KUBE_APISERVER_CLIENT, &["client auth"], None)),
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("use of kubernetes.io/kube-apiserver-client signer with system:masters group is not allowed"), "{err}");
    // Validation: 422 with the field.
    let bad = csr_yaml(
        "bad",
        "hello",
        "kubernetes.io/kube-apiserver-client",
        &["client auth", "flying"],
        Some(60),
    )
    .replace("signerName: kubernetes.io/kube-apiserver-client", "signerName: nodomain");
    let out = alice.run(&["create", "-f", "-"], Some(&bad));
    let err = String::from_utf8_lossy(&out.stderr);
    for want in [
        "is invalid",
        "spec.request: Invalid value",
        "PEM block type must be CERTIFICATE REQUEST",
        "spec.signerName: Invalid value: \"nodomain\"",
        "spec.usages[1]: Unsupported value: \"flying\"",
        "spec.expirationSeconds: Invalid value: 60: may not specify a duration less than 600 seconds",
    ] {
        assert!(err.contains(want), "{want:?} in {err}");
    }

    // A node renews its own certificate: approved (selfnodeclient) and signed by the
    // controllers; a request for another node's name is left pending.
    let node = server.cert_kubeconfig("n5.kubeconfig", "system:node:n5", &["system:nodes"]);
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let node_client = rt.block_on(async {
        let kc = kube::config::Kubeconfig::read_from(&node).expect("kubeconfig");
        let cfg =
            kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.expect("config");
        kube::Client::try_from(cfg).expect("client")
    });
    let (renewed, _) = rt
        .block_on(skiff_core::join::request_node_certificate(
            &node_client,
            "n5",
            std::time::Duration::from_secs(30),
        ))
        .expect("a renewed node certificate");
    let (nb, na) = certs::validity(&renewed).expect("certificate");
    assert!(
        na.duration_since(nb).expect("ordered").as_secs() > 300 * 24 * 3600,
        "the signing duration, a year"
    );
    let listed = admin.ok(&["get", "csr", "--no-headers"]);
    let row = listed.lines().find(|l| l.contains("system:node:n5")).unwrap_or_default();
    assert!(
        row.contains("kube-apiserver-client-kubelet") && row.contains("Approved,Issued"),
        "{listed}"
    );
    let reason = admin.ok(&[
        "get",
        "csr",
        row.split_whitespace().next().unwrap_or_default(),
        "-o",
        "jsonpath={.status.conditions[0].reason}",
    ]);
    assert_eq!(reason, "AutoApproved");
    let (other, _) =
        certs::new_request("system:node:n6", certs::NODES_GROUP, &[], &[]).expect("request");
    Kubectl::new(33, &node).ok_stdin(
        &["create", "-f", "-"],
        Some(&csr_yaml(
            "n6-by-n5",
            &other,
            certs::KUBE_APISERVER_CLIENT_KUBELET,
            &["digital signature", "client auth"],
            None,
        )),
    );
    std::thread::sleep(std::time::Duration::from_secs(2));
    let row = admin.ok(&["get", "csr", "n6-by-n5", "--no-headers"]);
    assert!(row.contains("Pending"), "another node's certificate is not approved: {row}");
}
