//! skiff-cni: the CNI plugin binary. libcni runs it with CNI_* variables and the network
//! configuration on stdin; the result or error goes to stdout (see `skiff_cni::plugin`).

use std::io::{Read, Write};

fn main() {
    let mut payload = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut payload) {
        eprintln!("skiff-cni: reading stdin: {e}");
    }
    let out = skiff_cni::plugin::run(&|k| std::env::var(k).ok(), &payload);
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = stdout.write_all(out.stdout.as_bytes()).and_then(|()| stdout.flush()) {
        eprintln!("skiff-cni: writing the result: {e}");
        std::process::exit(1);
    }
    std::process::exit(out.exit_code);
}
