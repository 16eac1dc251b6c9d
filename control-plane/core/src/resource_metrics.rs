//! The kubelet's resource metrics (`GET /metrics/resource`): the Prometheus text the node
//! agent serves and the apiserver's `metrics.k8s.io` scraper reads, as metrics-server reads
//! it from kubelets.
//!
//! Only the metrics metrics-server uses are written and read: cumulative CPU time
//! (`*_cpu_usage_seconds_total`, a counter) and working set (`*_memory_working_set_bytes`,
//! a gauge), for the node and for each container, each with the time it was sampled (the
//! sample's own timestamp, milliseconds since the epoch, not the scrape's). CPU *rates* come
//! from two scrapes, by the reader.

use std::collections::BTreeMap;
use std::fmt::Write as _;

/// One reading: cumulative CPU time and working set, each with its sample time.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Usage {
    /// Cumulative CPU time, in core-seconds.
    pub cpu_seconds: f64,
    /// When the CPU time was sampled (ms since the epoch).
    pub cpu_timestamp_ms: i64,
    pub memory_bytes: u64,
    /// When the working set was sampled (ms since the epoch).
    pub memory_timestamp_ms: i64,
}

impl Usage {
    /// A reading whose CPU time and working set were sampled at the same time.
    pub fn sampled_at(cpu_seconds: f64, memory_bytes: u64, timestamp_ms: i64) -> Usage {
        Usage {
            cpu_seconds,
            cpu_timestamp_ms: timestamp_ms,
            memory_bytes,
            memory_timestamp_ms: timestamp_ms,
        }
    }
}

/// A container's reading.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub usage: Usage,
}

/// What one scrape of a node returns.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct NodeScrape {
    /// The node as a whole (`None` when the agent could not read it).
    pub node: Option<Usage>,
    pub containers: Vec<ContainerUsage>,
    /// The agent could not read its containers' stats (`resource_scrape_error 1`).
    pub scrape_error: bool,
}

const CONTAINER_CPU: &str = "container_cpu_usage_seconds_total";
const CONTAINER_MEMORY: &str = "container_memory_working_set_bytes";
const NODE_CPU: &str = "node_cpu_usage_seconds_total";
const NODE_MEMORY: &str = "node_memory_working_set_bytes";
const POD_CPU: &str = "pod_cpu_usage_seconds_total";
const POD_MEMORY: &str = "pod_memory_working_set_bytes";
const SCRAPE_ERROR: &str = "resource_scrape_error";

/// The Prometheus text of a scrape, as the kubelet writes it (families in name order, each
/// with its HELP and TYPE; pods' totals are their containers' sums).
pub fn render(scrape: &NodeScrape) -> String {
    let mut out = String::new();
    let mut family = |name: &str, help: &str, kind: &str, samples: &[(String, String, i64)]| {
        let _ = writeln!(out, "# HELP {name} [STABLE] {help}");
        let _ = writeln!(out, "# TYPE {name} {kind}");
        for (labels, value, ts) in samples {
            let _ = writeln!(out, "{name}{labels} {value} {ts}");
        }
    };
    let container_labels = |c: &ContainerUsage| {
        format!(
            "{{container=\"{}\",namespace=\"{}\",pod=\"{}\"}}",
            escape(&c.container),
            escape(&c.namespace),
            escape(&c.pod)
        )
    };
    let mut pods: BTreeMap<(&str, &str), Usage> = BTreeMap::new();
    for c in &scrape.containers {
        let pod = pods.entry((&c.namespace, &c.pod)).or_default();
        pod.cpu_seconds += c.usage.cpu_seconds;
        pod.cpu_timestamp_ms = pod.cpu_timestamp_ms.max(c.usage.cpu_timestamp_ms);
        pod.memory_bytes += c.usage.memory_bytes;
        pod.memory_timestamp_ms = pod.memory_timestamp_ms.max(c.usage.memory_timestamp_ms);
    }
    let pod_labels = |(ns, pod): &(&str, &str)| {
        format!("{{namespace=\"{}\",pod=\"{}\"}}", escape(ns), escape(pod))
    };
    let cpu = |u: &Usage| (u.cpu_seconds.to_string(), u.cpu_timestamp_ms);
    let memory = |u: &Usage| (u.memory_bytes.to_string(), u.memory_timestamp_ms);
    let with = |labels: String, (value, ts): (String, i64)| (labels, value, ts);
    family(
        CONTAINER_CPU,
        "Cumulative cpu time consumed by the container in core-seconds",
        "counter",
        &scrape
            .containers
            .iter()
            .map(|c| with(container_labels(c), cpu(&c.usage)))
            .collect::<Vec<_>>(),
    );
    family(
        CONTAINER_MEMORY,
        "Current working set of the container in bytes",
        "gauge",
        &scrape
            .containers
            .iter()
            .map(|c| with(container_labels(c), memory(&c.usage)))
            .collect::<Vec<_>>(),
    );
    let node: Vec<Usage> = scrape.node.iter().copied().collect();
    family(
        NODE_CPU,
        "Cumulative cpu time consumed by the node in core-seconds",
        "counter",
        &node.iter().map(|u| with(String::new(), cpu(u))).collect::<Vec<_>>(),
    );
    family(
        NODE_MEMORY,
        "Current working set of the node in bytes",
        "gauge",
        &node.iter().map(|u| with(String::new(), memory(u))).collect::<Vec<_>>(),
    );
    family(
        POD_CPU,
        "Cumulative cpu time consumed by the pod in core-seconds",
        "counter",
        &pods.iter().map(|(k, u)| with(pod_labels(k), cpu(u))).collect::<Vec<_>>(),
    );
    family(
        POD_MEMORY,
        "Current working set of the pod in bytes",
        "gauge",
        &pods.iter().map(|(k, u)| with(pod_labels(k), memory(u))).collect::<Vec<_>>(),
    );
    let _ = writeln!(
        out,
        "# HELP {SCRAPE_ERROR} [STABLE] 1 if there was an error while getting container metrics, 0 otherwise"
    );
    let _ = writeln!(out, "# TYPE {SCRAPE_ERROR} gauge");
    let _ = writeln!(out, "{SCRAPE_ERROR} {}", u8::from(scrape.scrape_error));
    out
}

/// A label value in Prometheus' escaping.
fn escape(s: &str) -> String {
    s.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// Why a resource metrics text could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("resource metrics line {line}: {reason}")]
pub struct ParseError {
    pub line: usize,
    pub reason: String,
}

/// Reads the text [`render`] writes (or a kubelet's): the node's and the containers'
/// readings. Families other than these are skipped; a sample without a timestamp is
/// refused (a rate needs the sample time), as is a malformed line.
pub fn parse(text: &str) -> Result<NodeScrape, ParseError> {
    let mut node = Usage::default();
    let mut node_seen = (false, false);
    let mut containers: BTreeMap<(String, String, String), (Usage, bool, bool)> = BTreeMap::new();
    let mut scrape_error = false;
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let err = |reason: &str| ParseError { line: i + 1, reason: reason.to_string() };
        let sample = Sample::parse(line).map_err(|r| err(&r))?;
        if sample.name == SCRAPE_ERROR {
            scrape_error = sample.value != 0.0;
            continue;
        }
        let relevant = [CONTAINER_CPU, CONTAINER_MEMORY, NODE_CPU, NODE_MEMORY];
        if !relevant.contains(&sample.name) {
            continue;
        }
        let ts = sample.timestamp.ok_or_else(|| err("a sample without a timestamp"))?;
        if !sample.value.is_finite() || sample.value < 0.0 {
            return Err(err("a negative or non-finite value"));
        }
        let (usage, cpu_seen, memory_seen) = match sample.name {
            NODE_CPU | NODE_MEMORY => (&mut node, &mut node_seen.0, &mut node_seen.1),
            _ => {
                let label = |name: &str| {
                    sample
                        .labels
                        .iter()
                        .find(|(k, _)| k == name)
                        .map(|(_, v)| v.clone())
                        .ok_or_else(|| err(&format!("a container sample without the {name} label")))
                };
                let key = (label("namespace")?, label("pod")?, label("container")?);
                let (usage, cpu, memory) = containers.entry(key).or_default();
                (usage, cpu, memory)
            }
        };
        if sample.name.ends_with("_cpu_usage_seconds_total") {
            usage.cpu_seconds = sample.value;
            usage.cpu_timestamp_ms = ts;
            *cpu_seen = true;
        } else {
            usage.memory_bytes = sample.value as u64;
            usage.memory_timestamp_ms = ts;
            *memory_seen = true;
        }
    }
    Ok(NodeScrape {
        node: (node_seen.0 && node_seen.1).then_some(node),
        // A container is reported with both readings (metrics-server drops the others).
        containers: containers
            .into_iter()
            .filter(|(_, (_, cpu, memory))| *cpu && *memory)
            .map(|((namespace, pod, container), (usage, ..))| ContainerUsage {
                namespace,
                pod,
                container,
                usage,
            })
            .collect(),
        scrape_error,
    })
}

/// One line of the text format: `name{label="value",...} value [timestamp]`.
struct Sample<'a> {
    name: &'a str,
    labels: Labels,
    value: f64,
    timestamp: Option<i64>,
}

impl<'a> Sample<'a> {
    fn parse(line: &'a str) -> Result<Sample<'a>, String> {
        let name_end =
            line.find(|c: char| c == '{' || c.is_whitespace()).ok_or("a sample without a value")?;
        let name = &line[..name_end];
        if name.is_empty() {
            return Err("a sample without a name".into());
        }
        let mut rest = &line[name_end..];
        let mut labels = Vec::new();
        if let Some(body) = rest.strip_prefix('{') {
            let (parsed, after) = parse_labels(body)?;
            labels = parsed;
            rest = after;
        }
        let mut fields = rest.split_whitespace();
        let value = fields.next().ok_or("a sample without a value")?;
        let value = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            "NaN" => f64::NAN,
            v => v.parse::<f64>().map_err(|_| format!("value {v:?} is not a number"))?,
        };
        let timestamp = fields
            .next()
            .map(|t| t.parse::<i64>().map_err(|_| format!("timestamp {t:?} is not an integer")))
            .transpose()?;
        if fields.next().is_some() {
            return Err("trailing fields after the timestamp".into());
        }
        Ok(Sample { name, labels, value, timestamp })
    }
}

/// A sample's labels, in order.
type Labels = Vec<(String, String)>;

/// The labels after `{`, up to and including `}`; returns them and the text after.
fn parse_labels(mut s: &str) -> Result<(Labels, &str), String> {
    let mut labels = Vec::new();
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok((labels, after));
        }
        let eq = s.find('=').ok_or("a label without a value")?;
        let name = s[..eq].trim().to_string();
        s = s[eq + 1..].trim_start().strip_prefix('"').ok_or("a label value without quotes")?;
        let mut value = String::new();
        let mut chars = s.char_indices();
        let end = loop {
            match chars.next() {
                Some((i, '"')) => break i,
                Some((_, '\\')) => match chars.next() {
                    Some((_, 'n')) => value.push('\n'),
                    Some((_, c)) => value.push(c),
                    None => return Err("an unterminated label value".into()),
                },
                Some((_, c)) => value.push(c),
                None => return Err("an unterminated label value".into()),
            }
        };
        labels.push((name, value));
        s = s[end + 1..].trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err("labels not separated by commas".into());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(cpu: f64, memory: u64, ts: i64) -> Usage {
        Usage::sampled_at(cpu, memory, ts)
    }

    #[test]
    fn round_trips() {
        let scrape = NodeScrape {
            node: Some(usage(1234.5, 2 << 30, 1_700_000_000_000)),
            containers: vec![
                ContainerUsage {
                    namespace: "default".into(),
                    pod: "web-1".into(),
                    container: "app".into(),
                    usage: usage(0.25, 4096, 1_700_000_000_100),
                },
                ContainerUsage {
                    namespace: "default".into(),
                    pod: "web-1".into(),
                    container: "side\"car".into(),
                    usage: usage(0.5, 8192, 1_700_000_000_200),
                },
            ],
            scrape_error: false,
        };
        let text = render(&scrape);
        assert!(
            text.contains(
                "container_cpu_usage_seconds_total{container=\"app\",namespace=\"default\",pod=\"web-1\"} 0.25 1700000000100"
            ),
            "{text}"
        );
        assert!(text.contains("pod_cpu_usage_seconds_total{namespace=\"default\",pod=\"web-1\"} 0.75 1700000000200"), "{text}");
        assert!(
            text.contains(
                "pod_memory_working_set_bytes{namespace=\"default\",pod=\"web-1\"} 12288 "
            ),
            "{text}"
        );
        assert!(text.contains("node_memory_working_set_bytes 2147483648 1700000000000"), "{text}");
        assert!(text.ends_with("resource_scrape_error 0\n"), "{text}");
        assert_eq!(parse(&text).unwrap(), scrape);
    }

    #[test]
    fn reads_a_kubelets_text() {
        // As a kubelet v1.32 writes it: scientific notation, other families, other labels.
        let text = r#"# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds
# TYPE container_cpu_usage_seconds_total counter
container_cpu_usage_seconds_total{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-6vb7p"} 6.349963 1711222222222
# HELP container_memory_working_set_bytes [STABLE] Current working set of the container in bytes
# TYPE container_memory_working_set_bytes gauge
container_memory_working_set_bytes{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-6vb7p"} 1.4974976e+07 1711222222333
# HELP container_start_time_seconds [STABLE] Start time of the container since unix epoch in seconds
# TYPE container_start_time_seconds gauge
container_start_time_seconds{container="coredns",namespace="kube-system",pod="coredns-55cb58b774-6vb7p"} 1.7112e+09 1711222222222
node_cpu_usage_seconds_total 1099.5 1711222220000
node_memory_working_set_bytes 9.4e+08 1711222220000
scrape_error 0
"#;
        let scrape = parse(text).unwrap();
        assert_eq!(scrape.node, Some(usage(1099.5, 940_000_000, 1711222220000)));
        assert_eq!(scrape.containers.len(), 1);
        let c = &scrape.containers[0];
        assert_eq!((c.namespace.as_str(), c.container.as_str()), ("kube-system", "coredns"));
        assert_eq!(c.usage.memory_bytes, 14_974_976);
        assert_eq!(c.usage.cpu_timestamp_ms, 1711222222222);
        assert_eq!(c.usage.memory_timestamp_ms, 1711222222333);
    }

    #[test]
    fn refuses_malformed_text() {
        for (text, reason) in [
            ("node_cpu_usage_seconds_total 12", "without a timestamp"),
            ("node_cpu_usage_seconds_total twelve 1", "not a number"),
            ("node_cpu_usage_seconds_total -1 1", "negative"),
            ("container_cpu_usage_seconds_total{pod=\"p\",namespace=\"n\"} 1 1", "container label"),
            ("container_cpu_usage_seconds_total{pod=\"p} 1 1", "unterminated"),
            ("container_cpu_usage_seconds_total{pod=p} 1 1", "quotes"),
            ("node_cpu_usage_seconds_total 1 1 1", "trailing"),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.reason.contains(reason), "{text}: {e}");
            assert_eq!(e.line, 1);
        }
    }

    #[test]
    fn keeps_only_containers_with_both_readings() {
        let text =
            "container_cpu_usage_seconds_total{container=\"a\",namespace=\"n\",pod=\"p\"} 1 5\n";
        let scrape = parse(text).unwrap();
        assert!(scrape.containers.is_empty());
        assert_eq!(scrape.node, None);
    }
}
