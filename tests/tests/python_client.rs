//! Runs the Python `kubernetes` client suite (tests/python: core, apps, watch, dynamic
//! discovery, CRDs and custom objects) with pytest from the venv that
//! `cargo xtask setup` creates, against a fresh skiff-server.

use std::process::Command;

use skiff_tests::{TestServer, workspace_root};

#[test]
fn python_kubernetes_client() {
    let root = workspace_root();
    let python = root.join("target/venv/bin/python");
    assert!(
        python.exists(),
        "{} is missing: run `cargo xtask setup` (or `cargo xtask test`) to create the client venv",
        python.display()
    );
    // The controllers name and establish the CRD of test_crds.py.
    let server = TestServer::start_with_controllers();
    let out = Command::new(&python)
        .args(["-m", "pytest", "-q", "-p", "no:cacheprovider"])
        .arg(root.join("tests/python"))
        .env("SKIFF_KUBECONFIG", &server.kubeconfig)
        .output()
        .expect("running pytest");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "pytest failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("5 passed"), "expected all five Python tests to run:\n{stdout}");
}
