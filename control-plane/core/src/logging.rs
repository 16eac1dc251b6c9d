//! Logging of every skiff binary: `tracing` to a stream, as text (colours only on a
//! terminal) or as JSON lines (`--log-format json`, one object per event with `timestamp`,
//! `level`, `target`, `fields` and the spans), filtered by `RUST_LOG` (default `info`); and the signals that stop
//! a binary gracefully.

use std::io::IsTerminal;

/// `--log-format`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    #[default]
    Text,
    /// One JSON object per line, for log collectors.
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!("unknown log format {other:?}: expected text or json")),
        }
    }
}

/// Where the lines go.
#[derive(Debug, Clone, Copy)]
pub enum LogStream {
    Stdout,
    Stderr,
}

/// Installs the global subscriber.
pub fn init(format: LogFormat, stream: LogStream) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let terminal = match stream {
        LogStream::Stdout => std::io::stdout().is_terminal(),
        LogStream::Stderr => std::io::stderr().is_terminal(),
    };
    match (format, stream) {
        (LogFormat::Text, LogStream::Stdout) => builder.with_ansi(terminal).init(),
        (LogFormat::Text, LogStream::Stderr) => {
            builder.with_ansi(terminal).with_writer(std::io::stderr).init()
        }
        (LogFormat::Json, LogStream::Stdout) => builder.json().with_current_span(false).init(),
        (LogFormat::Json, LogStream::Stderr) => {
            builder.json().with_current_span(false).with_writer(std::io::stderr).init()
        }
    }
}

/// Waits for SIGTERM (systemd's stop, a pod's deletion) or SIGINT (Ctrl-C) and returns
/// the name of the one that came, for the process's last log line.
pub async fn shutdown_signal() -> std::io::Result<&'static str> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.map(|()| "SIGINT"),
        _ = term.recv() => Ok("SIGTERM"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_formats_parse() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert!("xml".parse::<LogFormat>().unwrap_err().contains("text or json"));
    }
}
