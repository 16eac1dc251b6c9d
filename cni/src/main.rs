//! skiff-cni: the CNI plugin binary. libcni runs it with CNI_* variables and the network
//! configuration on stdin; the result or error goes to stdout (see `skiff_cni::plugin`).

use std::io::{Read, Write};

fn main() {
    // `skiff-cni install --bin-dir DIR [--conf-dir DIR ...]` (a DaemonSet's init container); everything else is
    // libcni calling the plugin, which passes no arguments.
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("install") {
        let done = skiff_cni::install::parse_args(&args[1..])
            .and_then(|a| skiff_cni::install::run(std::path::Path::new("/proc/self/exe"), &a));
        match done {
            Ok(done) => {
                for line in done {
                    println!("skiff-cni: {line}");
                }
                std::process::exit(0);
            }
            Err(e) => {
                let mut msg = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(s) = source {
                    msg.push_str(&format!(": {s}"));
                    source = s.source();
                }
                eprintln!("skiff-cni: {msg}");
                std::process::exit(1);
            }
        }
    }
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
