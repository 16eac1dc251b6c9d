use serde_json::{Value, json};

use super::*;

const SVC: Gvk<'static> = Gvk::new("", "v1", "Service");

fn svc() -> Value {
    json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default"},
        "spec": {"selector": {"app": "web"}, "ports": [{"port": 80}]}
    })
}

#[test]
fn service_defaults() {
    let s = admitted(SVC, svc());
    assert_eq!(
        s["spec"],
        json!({
            "selector": {"app": "web"},
            "ports": [{"port": 80, "protocol": "TCP", "targetPort": 80}],
            "type": "ClusterIP",
            "sessionAffinity": "None",
            "internalTrafficPolicy": "Cluster"
        })
    );
    assert_eq!(s["status"], json!({"loadBalancer": {}}));
    let mut lb = svc();
    lb["spec"]["type"] = json!("LoadBalancer");
    lb["spec"]["sessionAffinity"] = json!("ClientIP");
    let lb = admitted(SVC, lb);
    assert_eq!(lb["spec"]["externalTrafficPolicy"], "Cluster");
    assert_eq!(lb["spec"]["allocateLoadBalancerNodePorts"], true);
    assert_eq!(lb["spec"]["sessionAffinityConfig"], json!({"clientIP": {"timeoutSeconds": 10800}}));
    // A given clusterIP is mirrored into clusterIPs.
    let mut fixed = svc();
    fixed["spec"]["clusterIP"] = json!("10.96.0.10");
    let fixed = admitted(SVC, fixed);
    assert_eq!(fixed["spec"]["clusterIPs"], json!(["10.96.0.10"]));
    // Headless and ExternalName services need no ports.
    let mut headless = svc();
    headless["spec"] = json!({"clusterIP": "None"});
    admitted(SVC, headless);
    let mut ext = svc();
    ext["spec"] = json!({"type": "ExternalName", "externalName": "example.com."});
    let ext = admitted(SVC, ext);
    assert!(ext["spec"].get("internalTrafficPolicy").is_none());
}

#[test]
fn service_rejections() {
    let base = svc();
    let two_ports = json!([{"port": 80, "name": "http"}, {"port": 443}]);
    let cases: &[Case] = &[
        (
            "name",
            &|s| {
                s["metadata"]["name"] = json!("1web");
            },
            "metadata.name: Invalid value: \"1web\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')",
            "FieldValueInvalid",
        ),
        (
            "no ports",
            &|s| {
                s["spec"]["ports"] = json!([]);
            },
            "spec.ports: Required value",
            "FieldValueRequired",
        ),
        (
            "port range",
            &|s| {
                s["spec"]["ports"][0]["port"] = json!(0);
                s["spec"]["ports"][0]["targetPort"] = json!(80);
            },
            "spec.ports[0].port: Invalid value: 0: must be between 1 and 65535, inclusive",
            "FieldValueInvalid",
        ),
        (
            "protocol",
            &|s| {
                s["spec"]["ports"][0]["protocol"] = json!("XYZ");
            },
            "spec.ports[0].protocol: Unsupported value: \"XYZ\": supported values: \"SCTP\", \"TCP\", \"UDP\"",
            "FieldValueNotSupported",
        ),
        (
            "names required",
            &|s| {
                s["spec"]["ports"] = two_ports.clone();
            },
            "spec.ports[1].name: Required value",
            "FieldValueRequired",
        ),
        (
            "duplicate names",
            &|s| {
                s["spec"]["ports"] = json!([{"port": 80, "name": "a"}, {"port": 81, "name": "a"}]);
            },
            "spec.ports[1].name: Duplicate value: \"a\"",
            "FieldValueDuplicate",
        ),
        (
            "target port name",
            &|s| {
                s["spec"]["ports"][0]["targetPort"] = json!("HTTP");
            },
            "spec.ports[0].targetPort: Invalid value: \"HTTP\": must contain only alpha-numeric characters (a-z, 0-9), and hyphens (-)",
            "FieldValueInvalid",
        ),
        (
            "type",
            &|s| {
                s["spec"]["type"] = json!("Magic");
            },
            "spec.type: Unsupported value: \"Magic\": supported values: \"ClusterIP\", \"ExternalName\", \"LoadBalancer\", \"NodePort\"",
            "FieldValueNotSupported",
        ),
        (
            "nodePort on ClusterIP",
            &|s| {
                s["spec"]["ports"][0]["nodePort"] = json!(30080);
            },
            "spec.ports[0].nodePort: Forbidden: may not be used when `type` is 'ClusterIP'",
            "FieldValueForbidden",
        ),
        (
            "nodePort range",
            &|s| {
                s["spec"]["type"] = json!("NodePort");
                s["spec"]["ports"][0]["nodePort"] = json!(80);
            },
            "spec.ports[0].nodePort: Invalid value: 80: provided port is not in the valid range. The range of valid ports is 30000-32767",
            "FieldValueInvalid",
        ),
        (
            "clusterIP format",
            &|s| {
                s["spec"]["clusterIP"] = json!("10.0.0.300");
            },
            "spec.clusterIPs[0]: Invalid value: \"10.0.0.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            "FieldValueInvalid",
        ),
        (
            "affinity timeout",
            &|s| {
                s["spec"]["sessionAffinity"] = json!("ClientIP");
                s["spec"]["sessionAffinityConfig"] = json!({"clientIP": {"timeoutSeconds": 90000}});
            },
            "spec.sessionAffinityConfig.clientIP.timeoutSeconds: Invalid value: 90000: must be greater than 0 and less than 86400",
            "FieldValueInvalid",
        ),
        (
            "affinity value",
            &|s| {
                s["spec"]["sessionAffinity"] = json!("Sticky");
            },
            "spec.sessionAffinity: Unsupported value: \"Sticky\": supported values: \"ClientIP\", \"None\"",
            "FieldValueNotSupported",
        ),
        (
            "external policy on ClusterIP",
            &|s| {
                s["spec"]["externalTrafficPolicy"] = json!("Local");
            },
            "spec.externalTrafficPolicy: Invalid value: \"Local\": may only be set for externally-accessible services",
            "FieldValueInvalid",
        ),
        (
            "external policy value",
            &|s| {
                s["spec"]["type"] = json!("NodePort");
                s["spec"]["externalTrafficPolicy"] = json!("Far");
            },
            "spec.externalTrafficPolicy: Unsupported value: \"Far\": supported values: \"Cluster\", \"Local\"",
            "FieldValueNotSupported",
        ),
        (
            "selector",
            &|s| {
                s["spec"]["selector"] = json!({"app": "a b"});
            },
            "spec.selector: Invalid value: \"a b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
            "FieldValueInvalid",
        ),
        (
            "headless NodePort",
            &|s| {
                s["spec"]["type"] = json!("NodePort");
                s["spec"]["clusterIP"] = json!("None");
            },
            "spec.clusterIPs[0]: Invalid value: \"None\": may not be set to 'None' for NodePort services",
            "FieldValueInvalid",
        ),
        (
            "external name",
            &|s| {
                s["spec"] = json!({"type": "ExternalName"});
            },
            "spec.externalName: Required value",
            "FieldValueRequired",
        ),
        (
            "duplicate port",
            &|s| {
                s["spec"]["ports"] = json!([{"port": 80, "name": "a"}, {"port": 80, "name": "b"}]);
            },
            "",
            "",
        ),
    ];
    let (last, rest) = cases.split_last().unwrap();
    rejects(SVC, &base, rest);
    let mut s = base.clone();
    (last.1)(&mut s);
    let (_, errs) = create(SVC, s);
    let e = errs.iter().find(|e| e.field == "spec.ports[1]").expect("duplicate port error");
    assert_eq!(e.reason(), "FieldValueDuplicate");
}

#[test]
fn service_updates_keep_allocations() {
    let mut stored = admitted(SVC, {
        let mut s = svc();
        s["spec"]["type"] = json!("NodePort");
        s
    });
    // The apiserver allocated these.
    stored["spec"]["clusterIP"] = json!("10.96.0.20");
    stored["spec"]["clusterIPs"] = json!(["10.96.0.20"]);
    stored["spec"]["ipFamilies"] = json!(["IPv4"]);
    stored["spec"]["ipFamilyPolicy"] = json!("SingleStack");
    stored["spec"]["ports"][0]["nodePort"] = json!(31000);
    // A PUT of the manifest without them keeps them.
    let mut new = svc();
    new["spec"]["type"] = json!("NodePort");
    new["metadata"]["labels"] = json!({"a": "b"});
    let (obj, errs, prepared) = update(SVC, None, &stored, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(!prepared.spec_changed, "services keep no generation");
    assert_eq!(obj["spec"]["clusterIP"], "10.96.0.20");
    assert_eq!(obj["spec"]["clusterIPs"], json!(["10.96.0.20"]));
    assert_eq!(obj["spec"]["ipFamilies"], json!(["IPv4"]));
    assert_eq!(obj["spec"]["ports"][0]["nodePort"], 31000);
    assert_eq!(obj["status"], json!({"loadBalancer": {}}));
    // Changing the clusterIP is refused.
    let mut new = stored.clone();
    new["spec"]["clusterIP"] = json!("10.96.0.21");
    new["spec"]["clusterIPs"] = json!(["10.96.0.21"]);
    let (_, errs, _) = update(SVC, None, &stored, new);
    assert_has(
        &errs,
        "spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.21\"}: may not change once set",
        "FieldValueInvalid",
    );
    // A merge patch of the type alone drops what a ClusterIP service cannot carry.
    let mut new = stored.clone();
    new["spec"]["externalTrafficPolicy"] = json!("Cluster");
    let stored_np = new.clone();
    let mut new = stored_np.clone();
    new["spec"]["type"] = json!("ClusterIP");
    let (obj, errs, _) = update(SVC, None, &stored_np, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert!(obj["spec"]["ports"][0].get("nodePort").is_none());
    assert!(obj["spec"].get("externalTrafficPolicy").is_none());
    assert_eq!(obj["spec"]["clusterIP"], "10.96.0.20");
    // An old client that sends only a new clusterIP is judged on it.
    let mut new = stored.clone();
    new["spec"]["clusterIP"] = json!("10.96.0.30");
    let (obj, errs, _) = update(SVC, None, &stored, new);
    assert_eq!(obj["spec"]["clusterIPs"], json!(["10.96.0.30"]));
    assert_has(
        &errs,
        "spec.clusterIPs[0]: Invalid value: []string{\"10.96.0.30\"}: may not change once set",
        "FieldValueInvalid",
    );
    // Switching to ExternalName may drop it.
    let mut new = stored.clone();
    new["spec"] = json!({"type": "ExternalName", "externalName": "example.com"});
    let (_, errs, _) = update(SVC, None, &stored, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
}

#[test]
fn load_balancer_status_is_validated_and_ip_mode_defaulted() {
    let mut lb = svc();
    lb["spec"]["type"] = json!("LoadBalancer");
    let old = admitted(SVC, lb);
    let mut new = old.clone();
    new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}, {"hostname": "lb.example.com"}]}});
    let (obj, errs, _) = update(SVC, Some("status"), &old, new);
    assert!(errs.is_empty(), "{:?}", strings(&errs));
    assert_eq!(obj["status"]["loadBalancer"]["ingress"][0]["ipMode"], "VIP", "defaulted");
    assert!(obj["status"]["loadBalancer"]["ingress"][1].get("ipMode").is_none());

    let mut bad = old.clone();
    bad["status"] = json!({"loadBalancer": {"ingress": [
        {"ip": "192.0.2.300"},
        {"hostname": "192.0.2.10"},
        {"hostname": "lb.example.com", "ipMode": "VIP"},
        {"ip": "192.0.2.11", "ipMode": "Direct"}]}});
    let (_, errs, _) = update(SVC, Some("status"), &old, bad);
    assert_eq!(
        strings(&errs),
        [
            "status.loadBalancer.ingress[0].ip: Invalid value: \"192.0.2.300\": must be a valid IP address, (e.g. 10.9.8.7 or 2001:db8::ffff)",
            "status.loadBalancer.ingress[1].hostname: Invalid value: \"192.0.2.10\": must be a DNS name, not an IP address",
            "status.loadBalancer.ingress[2].ipMode: Forbidden: may not be specified when `ip` is not set",
            "status.loadBalancer.ingress[3].ipMode: Unsupported value: \"Direct\": supported values: \"Proxy\", \"VIP\"",
        ]
    );

    // Only a LoadBalancer Service has load balancer addresses.
    let plain = admitted(SVC, svc());
    let mut new = plain.clone();
    new["status"] = json!({"loadBalancer": {"ingress": [{"ip": "192.0.2.10"}]}});
    let (_, errs, _) = update(SVC, Some("status"), &plain, new);
    assert_eq!(
        strings(&errs),
        [
            "status.loadBalancer.ingress: Forbidden: may only be used when `spec.type` is 'LoadBalancer'"
        ]
    );
}
