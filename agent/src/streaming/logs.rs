//! Container logs: the CRI log format (`<RFC3339Nano> <stream> <P|F> <text>`) read from the
//! files containerd writes, with the kubelet's options (tail, since, timestamps, limit,
//! follow) applied as the lines are streamed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use jiff::Timestamp;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
use tokio::sync::mpsc;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid query parameter {name}={value}")]
    Param { name: &'static str, value: String },
    #[error("reading the log file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The kubelet's log options (`/containerLogs/...?follow=&tailLines=&...`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    /// Only the last N lines.
    pub tail_lines: Option<usize>,
    /// Only lines at or after this time (`sinceSeconds` / `sinceTime`).
    pub since: Option<Timestamp>,
    /// Stop after this many bytes.
    pub limit_bytes: Option<usize>,
}

impl LogOptions {
    /// Parse the query string of a `/containerLogs` request.
    pub fn from_query(query: &[(String, String)], now: Timestamp) -> Result<Self, Error> {
        let mut opts = LogOptions::default();
        for (k, v) in query {
            let bad = |name: &'static str| Error::Param { name, value: v.clone() };
            match k.as_str() {
                "follow" => opts.follow = parse_bool(v).ok_or_else(|| bad("follow"))?,
                "previous" => opts.previous = parse_bool(v).ok_or_else(|| bad("previous"))?,
                "timestamps" => opts.timestamps = parse_bool(v).ok_or_else(|| bad("timestamps"))?,
                "tailLines" => {
                    let n: i64 = v.parse().map_err(|_| bad("tailLines"))?;
                    // Negative means "all", as upstream.
                    opts.tail_lines = usize::try_from(n).ok();
                }
                "limitBytes" => {
                    let n: i64 = v.parse().map_err(|_| bad("limitBytes"))?;
                    opts.limit_bytes = Some(usize::try_from(n).map_err(|_| bad("limitBytes"))?);
                }
                "sinceSeconds" => {
                    let n: i64 = v.parse().map_err(|_| bad("sinceSeconds"))?;
                    if n <= 0 {
                        return Err(bad("sinceSeconds"));
                    }
                    // Further back than time goes is "from the start".
                    opts.since = Some(skiff_core::time::sub_secs(now, n));
                }
                "sinceTime" => {
                    opts.since = Some(v.parse().map_err(|_| bad("sinceTime"))?);
                }
                _ => {}
            }
        }
        Ok(opts)
    }
}

pub(crate) fn parse_bool(v: &str) -> Option<bool> {
    match v {
        "" | "1" | "true" | "True" | "TRUE" | "t" | "T" => Some(true),
        "0" | "false" | "False" | "FALSE" | "f" | "F" => Some(false),
        _ => None,
    }
}

/// One line of a CRI log file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry<'a> {
    pub timestamp: &'a str,
    pub stream: &'a str,
    /// `false` for a `P` (partial) entry: the text continues in the next entry.
    pub full: bool,
    pub text: &'a [u8],
}

/// Parse one line (without its newline) of the CRI log format; `None` if malformed.
pub fn parse_line(line: &[u8]) -> Option<Entry<'_>> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let timestamp = std::str::from_utf8(parts.next()?).ok()?;
    let stream = std::str::from_utf8(parts.next()?).ok()?;
    let tags = parts.next()?;
    let text = parts.next().unwrap_or(b"");
    // Tags are ':'-separated; the first is P or F.
    let full = match tags.split(|b| *b == b':').next()? {
        b"F" => true,
        b"P" => false,
        _ => return None,
    };
    if timestamp.is_empty() || !matches!(stream, "stdout" | "stderr") {
        return None;
    }
    Some(Entry { timestamp, stream, full, text })
}

/// A logical log line: the entries up to and including a full one.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Line {
    time: Option<Timestamp>,
    /// The output for this line (timestamp prefix applied when asked for).
    out: Vec<u8>,
}

/// Turns raw bytes of a CRI log file into output lines, joining partial entries.
#[derive(Debug, Default)]
pub struct Decoder {
    timestamps: bool,
    /// Bytes of a raw line whose newline has not been read yet.
    raw: Vec<u8>,
    /// A logical line still being assembled from partial entries.
    pending: Option<Line>,
}

impl Decoder {
    pub fn new(timestamps: bool) -> Self {
        Decoder { timestamps, ..Default::default() }
    }

    /// Feed bytes; returns the logical lines they complete.
    fn feed(&mut self, data: &[u8], lines: &mut Vec<Line>) {
        let mut rest = data;
        while let Some(nl) = rest.iter().position(|b| *b == b'\n') {
            let (head, tail) = rest.split_at(nl);
            rest = &tail[1..];
            if self.raw.is_empty() {
                self.entry(head, lines);
            } else {
                let mut raw = std::mem::take(&mut self.raw);
                raw.extend_from_slice(head);
                self.entry(&raw, lines);
            }
        }
        self.raw.extend_from_slice(rest);
    }

    fn entry(&mut self, raw: &[u8], lines: &mut Vec<Line>) {
        let Some(e) = parse_line(raw) else {
            tracing::debug!(line = %String::from_utf8_lossy(raw), "skipping a malformed log line");
            return;
        };
        let line = self.pending.get_or_insert_with(|| {
            let time = e.timestamp.parse::<Timestamp>().ok();
            let mut out = Vec::new();
            if self.timestamps {
                out.extend_from_slice(e.timestamp.as_bytes());
                out.push(b' ');
            }
            Line { time, out }
        });
        line.out.extend_from_slice(e.text);
        if e.full {
            line.out.push(b'\n');
            if let Some(line) = self.pending.take() {
                lines.push(line);
            }
        }
    }
}

/// Where the sender writes and how much it may still write.
struct Sink {
    tx: mpsc::Sender<Bytes>,
    left: Option<usize>,
}

impl Sink {
    /// Send lines; `false` when the reader is gone or the byte limit is reached.
    async fn send(&mut self, lines: Vec<Line>, since: Option<Timestamp>) -> bool {
        let mut buf = Vec::new();
        for line in lines {
            if let (Some(since), Some(t)) = (since, line.time)
                && t < since
            {
                continue;
            }
            buf.extend_from_slice(&line.out);
        }
        if buf.is_empty() {
            return true;
        }
        let mut done = false;
        if let Some(left) = self.left.as_mut() {
            if buf.len() >= *left {
                buf.truncate(*left);
                done = true;
            }
            *left -= buf.len();
        }
        if buf.is_empty() {
            return false;
        }
        self.tx.send(Bytes::from(buf)).await.is_ok() && !done
    }
}

/// Is the container still writing to this log?
pub trait Liveness: Send + 'static {
    fn running(&mut self) -> impl std::future::Future<Output = bool> + Send;
}

/// How often a followed log is polled for new data.
const POLL: Duration = Duration::from_millis(100);
/// How often a followed log checks whether its container still runs.
const LIVENESS_EVERY: u32 = 5;

/// Stream the log at `path` into `tx` with `opts`; when following, until the container
/// stops (per `alive`) and its log is drained, or the receiver goes away.
pub async fn stream<L: Liveness>(
    path: &Path,
    opts: &LogOptions,
    mut alive: L,
    tx: mpsc::Sender<Bytes>,
) -> Result<(), Error> {
    let read_err = |source| Error::Read { path: path.to_path_buf(), source };
    let mut file = tokio::fs::File::open(path).await.map_err(read_err)?;
    let mut decoder = Decoder::new(opts.timestamps);
    let mut sink = Sink { tx, left: opts.limit_bytes };
    if opts.limit_bytes == Some(0) {
        return Ok(());
    }
    let mut offset = 0u64;
    if let Some(n) = opts.tail_lines {
        // The last lines need the whole file (at most the runtime's rotation size).
        let mut data = Vec::new();
        file.read_to_end(&mut data).await.map_err(read_err)?;
        offset = data.len() as u64;
        let mut lines = Vec::new();
        decoder.feed(&data, &mut lines);
        if let Some(since) = opts.since {
            lines.retain(|l| l.time.is_none_or(|t| t >= since));
        }
        let skip = lines.len().saturating_sub(n);
        lines.drain(..skip);
        if !sink.send(lines, None).await {
            return Ok(());
        }
    }
    // Without a tail the file streams in chunks; then, when following, new data as it comes.
    let mut buf = vec![0u8; 64 * 1024];
    let mut idle_polls = 0u32;
    loop {
        let n = file.read(&mut buf).await.map_err(read_err)?;
        if n > 0 {
            offset += n as u64;
            idle_polls = 0;
            let mut lines = Vec::new();
            decoder.feed(&buf[..n], &mut lines);
            if !sink.send(lines, opts.since).await {
                return Ok(());
            }
            continue;
        }
        if !opts.follow {
            return Ok(());
        }
        // Rotated or truncated under us: start over from the top of the new file.
        if let Ok(meta) = tokio::fs::metadata(path).await
            && meta.len() < offset
        {
            file = tokio::fs::File::open(path).await.map_err(read_err)?;
            file.seek(std::io::SeekFrom::Start(0)).await.map_err(read_err)?;
            offset = 0;
            continue;
        }
        idle_polls += 1;
        if idle_polls.is_multiple_of(LIVENESS_EVERY) && !alive.running().await {
            // One last read after the container stopped: what it wrote before exiting.
            let n = file.read(&mut buf).await.map_err(read_err)?;
            if n > 0 {
                let mut lines = Vec::new();
                decoder.feed(&buf[..n], &mut lines);
                if !sink.send(lines, opts.since).await {
                    return Ok(());
                }
                continue;
            }
            return Ok(());
        }
        tokio::select! {
            _ = tokio::time::sleep(POLL) => {}
            _ = sink.tx.closed() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_cri_lines() {
        let e = parse_line(b"2016-10-06T00:17:09.669794202Z stdout F hello world").unwrap();
        assert_eq!(e.timestamp, "2016-10-06T00:17:09.669794202Z");
        assert_eq!(e.stream, "stdout");
        assert!(e.full);
        assert_eq!(e.text, b"hello world");
        let e = parse_line(b"2016-10-06T00:17:09Z stderr P ").unwrap();
        assert!(!e.full);
        assert_eq!(e.text, b"");
        assert!(parse_line(b"garbage").is_none());
        assert!(parse_line(b"2016-10-06T00:17:09Z stdin F x").is_none());
    }

    #[test]
    fn joins_partial_entries_across_reads() {
        let mut d = Decoder::new(true);
        let mut lines = Vec::new();
        d.feed(b"2020-01-01T00:00:00Z stdout P hel", &mut lines);
        assert!(lines.is_empty());
        d.feed(b"lo\n2020-01-01T00:00:01Z stdout F  world\n2020-01-01T00:00:02Z std", &mut lines);
        assert_eq!(lines.len(), 1);
        assert_eq!(lines[0].out, b"2020-01-01T00:00:00Z hello world\n");
        d.feed(b"err F second\n", &mut lines);
        assert_eq!(lines[1].out, b"2020-01-01T00:00:02Z second\n");
    }

    #[test]
    fn parses_options() {
        let now = Timestamp::now();
        let q = |s: &[(&str, &str)]| -> Vec<(String, String)> {
            s.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
        };
        let o = LogOptions::from_query(
            &q(&[("follow", "true"), ("tailLines", "3"), ("sinceSeconds", "10")]),
            now,
        )
        .unwrap();
        assert!(o.follow && !o.previous && !o.timestamps);
        assert_eq!(o.tail_lines, Some(3));
        assert_eq!(o.since, Some(skiff_core::time::sub_secs(now, 10)));
        assert!(LogOptions::from_query(&q(&[("tailLines", "x")]), now).is_err());
        assert_eq!(
            LogOptions::from_query(&q(&[("tailLines", "-1")]), now).unwrap().tail_lines,
            None
        );
    }
}
