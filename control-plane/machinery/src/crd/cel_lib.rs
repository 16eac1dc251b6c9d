//! The Kubernetes CEL libraries rules use beyond the CEL standard library and the strings
//! extension (both the `cel` crate's), with upstream's semantics (`k8s.io/apiserver`
//! `pkg/cel/library` at Kubernetes v1.33): lists (`isSorted`, `sum`, `min`, `max`,
//! `indexOf`, `lastIndexOf`), regex (`find`, `findAll`), URLs (`url`, `isURL`, `getScheme`,
//! `getHost`, `getHostname`, `getPort`, `getEscapedPath`, `getQuery`), IP addresses and
//! CIDRs (`ip`, `isIP`, `cidr`, `isCIDR`, `family`, `containsIP`, ...), quantities
//! (`quantity`, `isQuantity`, `compareTo`, `isLessThan`, `asInteger`, `add`, ...) and
//! `sets` (`sets.contains`, `sets.equivalent`, `sets.intersects`).
//!
//! Every function is registered on the [`Env`] for dynamic arguments and dispatches on
//! the values it gets, answering `no such overload` like cel-go for the types it does not
//! take.

use std::net::IpAddr;
use std::sync::Arc;

use cel::common::types::DYN_TYPE;
use cel::common::value::{CowVal, Val};
use cel::objects::Opaque;
use cel::{DeclarationError, Env, ExecutionError, Value};

type Result<T, E = ExecutionError> = std::result::Result<T, E>;

/// The namespaces of qualified functions (`sets.contains`, `optional.of`, ...).
pub fn is_namespace(ns: &str) -> bool {
    matches!(ns, "sets" | "optional" | "strings" | "ip")
}

/// Functions (and member functions) of the rules' environment, for the compile-time
/// check of undeclared references.
pub fn is_function(name: &str) -> bool {
    const NAMES: &[&str] = &[
        // standard library
        "size",
        "int",
        "uint",
        "double",
        "string",
        "bytes",
        "bool",
        "type",
        "dyn",
        "duration",
        "timestamp",
        "matches",
        "contains",
        "startsWith",
        "endsWith",
        "getDate",
        "getDayOfMonth",
        "getDayOfWeek",
        "getDayOfYear",
        "getFullYear",
        "getHours",
        "getMilliseconds",
        "getMinutes",
        "getMonth",
        "getSeconds",
        "hasValue",
        "value",
        "orValue",
        "or",
        "optional.of",
        "optional.none",
        "optional.ofNonZeroValue",
        "optMap",
        "optFlatMap",
        // strings extension
        "charAt",
        "indexOf",
        "lastIndexOf",
        "join",
        "lowerAscii",
        "upperAscii",
        "trim",
        "replace",
        "split",
        "substring",
        "format",
        "strings.quote",
        "reverse",
        // Kubernetes libraries
        "isSorted",
        "sum",
        "min",
        "max",
        "find",
        "findAll",
        "url",
        "isURL",
        "getScheme",
        "getHost",
        "getHostname",
        "getPort",
        "getEscapedPath",
        "getQuery",
        "ip",
        "isIP",
        "cidr",
        "isCIDR",
        "family",
        "isUnspecified",
        "isLoopback",
        "isLinkLocalMulticast",
        "isLinkLocalUnicast",
        "isGlobalUnicast",
        "containsIP",
        "containsCIDR",
        "prefixLength",
        "masked",
        "ip.isCanonical",
        "quantity",
        "isQuantity",
        "sign",
        "isInteger",
        "asInteger",
        "asApproximateFloat",
        "add",
        "sub",
        "isLessThan",
        "isGreaterThan",
        "compareTo",
        "sets.contains",
        "sets.equivalent",
        "sets.intersects",
    ];
    NAMES.contains(&name)
}

/// Wraps an implementation over [`Value`]s as an overload of the `cel` crate.
macro_rules! overload {
    ($wrapper:ident, $imp:path) => {
        fn $wrapper<'b, 'v>(args: Vec<CowVal<'b, 'v>>) -> Result<CowVal<'b, 'v>> {
            let vals =
                args.iter().map(|a| Value::try_from(a.as_ref())).collect::<Result<Vec<_>>>()?;
            let out: Box<dyn Val> = $imp(&vals)?.try_into()?;
            Ok(CowVal::Owned(out))
        }
    };
}

/// Registers the libraries on `env` (after the strings extension, whose string overloads
/// of `indexOf`/`lastIndexOf` win for strings).
pub fn register(env: &mut Env) -> Result<(), DeclarationError> {
    let dyns = |n: usize| (0..n).map(|_| DYN_TYPE).collect::<Vec<_>>();
    macro_rules! member {
        ($name:literal, $n:literal, $f:ident) => {
            env.add_member_overload($name, concat!("k8s_", $name, "_", $n), DYN_TYPE, dyns($n), $f)?
        };
    }
    macro_rules! global {
        ($name:literal, $n:literal, $f:ident) => {
            env.add_overload($name, concat!("k8s_g_", $name, "_", $n), dyns($n), $f)?
        };
    }
    member!("isSorted", 0, is_sorted_o);
    member!("sum", 0, sum_o);
    member!("min", 0, min_o);
    member!("max", 0, max_o);
    member!("indexOf", 1, index_of_o);
    member!("lastIndexOf", 1, last_index_of_o);
    member!("find", 1, find_o);
    member!("findAll", 1, find_all_o);
    member!("findAll", 2, find_all_n_o);
    global!("url", 1, url_o);
    global!("isURL", 1, is_url_o);
    for (name, f) in [
        ("getScheme", url_scheme_o as cel::common::functions::Function),
        ("getHost", url_host_o),
        ("getHostname", url_hostname_o),
        ("getPort", url_port_o),
        ("getEscapedPath", url_path_o),
        ("getQuery", url_query_o),
    ] {
        env.add_member_overload(name, &format!("k8s_{name}"), DYN_TYPE, vec![], f)?;
    }
    global!("ip", 1, ip_o);
    global!("isIP", 1, is_ip_o);
    global!("cidr", 1, cidr_o);
    global!("isCIDR", 1, is_cidr_o);
    global!("ip.isCanonical", 1, ip_is_canonical_o);
    member!("family", 0, family_o);
    member!("isUnspecified", 0, is_unspecified_o);
    member!("isLoopback", 0, is_loopback_o);
    member!("isLinkLocalMulticast", 0, is_ll_multicast_o);
    member!("isLinkLocalUnicast", 0, is_ll_unicast_o);
    member!("isGlobalUnicast", 0, is_global_unicast_o);
    member!("containsIP", 1, contains_ip_o);
    member!("containsCIDR", 1, contains_cidr_o);
    member!("prefixLength", 0, prefix_length_o);
    member!("masked", 0, masked_o);
    member!("ip", 0, cidr_ip_o);
    global!("quantity", 1, quantity_o);
    global!("isQuantity", 1, is_quantity_o);
    member!("sign", 0, q_sign_o);
    member!("isInteger", 0, q_is_integer_o);
    member!("asInteger", 0, q_as_integer_o);
    member!("asApproximateFloat", 0, q_as_float_o);
    member!("add", 1, q_add_o);
    member!("sub", 1, q_sub_o);
    member!("isLessThan", 1, q_less_o);
    member!("isGreaterThan", 1, q_greater_o);
    member!("compareTo", 1, q_compare_o);
    global!("sets.contains", 2, sets_contains_o);
    global!("sets.equivalent", 2, sets_equivalent_o);
    global!("sets.intersects", 2, sets_intersects_o);
    Ok(())
}

fn no_overload(function: &str, args: &[Value]) -> ExecutionError {
    ExecutionError::no_such_overload(
        function,
        args.iter().map(|a| format!("{}", a.type_of())).collect(),
    )
}

fn err(function: &str, msg: impl ToString) -> ExecutionError {
    ExecutionError::function_error(function, msg)
}

fn list<'a>(function: &str, args: &'a [Value]) -> Result<&'a [Value]> {
    match args.first() {
        Some(Value::List(l)) => Ok(l.as_slice()),
        _ => Err(no_overload(function, args)),
    }
}

fn string<'a>(function: &str, args: &'a [Value], i: usize) -> Result<&'a str> {
    match args.get(i) {
        Some(Value::String(s)) => Ok(s.as_str()),
        _ => Err(no_overload(function, args)),
    }
}

// ---------------------------------------------------------------------------------------
// Lists

/// The order of two comparable values (numbers across types, strings, bools, bytes,
/// durations, timestamps, quantities).
fn compare(a: &Value, b: &Value) -> Option<std::cmp::Ordering> {
    use Value::*;
    match (a, b) {
        (Int(x), Int(y)) => Some(x.cmp(y)),
        (UInt(x), UInt(y)) => Some(x.cmp(y)),
        (Float(x), Float(y)) => x.partial_cmp(y),
        (Int(x), Float(y)) => (*x as f64).partial_cmp(y),
        (Float(x), Int(y)) => x.partial_cmp(&(*y as f64)),
        (String(x), String(y)) => Some(x.cmp(y)),
        (Bool(x), Bool(y)) => Some(x.cmp(y)),
        (Bytes(x), Bytes(y)) => Some(x.cmp(y)),
        (Duration(x), Duration(y)) => Some(x.cmp(y)),
        (Timestamp(x), Timestamp(y)) => Some(x.cmp(y)),
        (Opaque(_), Opaque(_)) => Some(quantity_of(a)?.cmp(&quantity_of(b)?)),
        _ => None,
    }
}

fn is_sorted(args: &[Value]) -> Result<Value> {
    let l = list("isSorted", args)?;
    for w in l.windows(2) {
        match compare(&w[0], &w[1]) {
            Some(std::cmp::Ordering::Greater) => return Ok(Value::Bool(false)),
            Some(_) => {}
            None => return Err(no_overload("isSorted", args)),
        }
    }
    Ok(Value::Bool(true))
}
overload!(is_sorted_o, is_sorted);

fn sum(args: &[Value]) -> Result<Value> {
    let l = list("sum", args)?;
    let mut acc: Option<Value> = None;
    for v in l {
        acc = Some(match (acc, v) {
            (None, v) => v.clone(),
            (Some(Value::Int(a)), Value::Int(b)) => {
                Value::Int(a.checked_add(*b).ok_or_else(|| err("sum", "integer overflow"))?)
            }
            (Some(Value::UInt(a)), Value::UInt(b)) => {
                Value::UInt(a.checked_add(*b).ok_or_else(|| err("sum", "integer overflow"))?)
            }
            (Some(Value::Float(a)), Value::Float(b)) => Value::Float(a + b),
            (Some(Value::Duration(a)), Value::Duration(b)) => Value::Duration(a + *b),
            _ => return Err(no_overload("sum", args)),
        });
    }
    // An empty list sums to 0 (upstream types the zero after the list's element type;
    // an untyped list here gives int).
    Ok(acc.unwrap_or(Value::Int(0)))
}
overload!(sum_o, sum);

fn extreme(function: &str, args: &[Value], want: std::cmp::Ordering) -> Result<Value> {
    let l = list(function, args)?;
    let mut best: Option<&Value> = None;
    for v in l {
        best = Some(match best {
            None => v,
            Some(b) => match compare(v, b) {
                Some(o) if o == want => v,
                Some(_) => b,
                None => return Err(no_overload(function, args)),
            },
        });
    }
    best.cloned().ok_or_else(|| err(function, format!("{function} called on empty list")))
}
fn min(args: &[Value]) -> Result<Value> {
    extreme("min", args, std::cmp::Ordering::Less)
}
fn max(args: &[Value]) -> Result<Value> {
    extreme("max", args, std::cmp::Ordering::Greater)
}
overload!(min_o, min);
overload!(max_o, max);

fn index_of(args: &[Value]) -> Result<Value> {
    let l = list("indexOf", args)?;
    let x = &args[1];
    Ok(Value::Int(l.iter().position(|v| v == x).map_or(-1, |i| i as i64)))
}
fn last_index_of(args: &[Value]) -> Result<Value> {
    let l = list("lastIndexOf", args)?;
    let x = &args[1];
    Ok(Value::Int(l.iter().rposition(|v| v == x).map_or(-1, |i| i as i64)))
}
overload!(index_of_o, index_of);
overload!(last_index_of_o, last_index_of);

// ---------------------------------------------------------------------------------------
// Regex

fn regex(function: &str, args: &[Value]) -> Result<regex::Regex> {
    regex::Regex::new(string(function, args, 1)?).map_err(|e| err(function, e))
}

fn find(args: &[Value]) -> Result<Value> {
    let s = string("find", args, 0)?;
    let re = regex("find", args)?;
    Ok(Value::from(re.find(s).map_or("", |m| m.as_str()).to_string()))
}
fn find_all_n(args: &[Value]) -> Result<Value> {
    let s = string("findAll", args, 0)?;
    let re = regex("findAll", args)?;
    let n = match args.get(2) {
        Some(Value::Int(n)) => *n,
        None => -1,
        _ => return Err(no_overload("findAll", args)),
    };
    let limit = if n < 0 { usize::MAX } else { n as usize };
    let found: Vec<Value> =
        re.find_iter(s).take(limit).map(|m| Value::from(m.as_str().to_string())).collect();
    Ok(Value::List(Arc::new(found)))
}
overload!(find_o, find);
overload!(find_all_o, find_all_n);
overload!(find_all_n_o, find_all_n);

// ---------------------------------------------------------------------------------------
// URLs

/// A URL as Go's `url.Parse` splits it (only absolute URIs and absolute paths, as
/// upstream's `url()` accepts).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Url {
    scheme: String,
    host: String,
    path: String,
    query: String,
}

impl Opaque for Url {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.URL"
    }
}

fn parse_url(s: &str) -> Option<Url> {
    if s.chars().any(|c| c.is_control() || c == ' ') {
        return None;
    }
    let s = s.split('#').next().unwrap_or_default();
    let (rest, query) = match s.split_once('?') {
        Some((r, q)) => (r, q.to_string()),
        None => (s, String::new()),
    };
    if rest.starts_with('/') {
        return Some(Url { scheme: String::new(), host: String::new(), path: rest.into(), query });
    }
    let (scheme, after) = rest.split_once(':')?;
    let mut chars = scheme.chars();
    if !chars.next()?.is_ascii_alphabetic()
        || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
    {
        return None;
    }
    let (host, path) = match after.strip_prefix("//") {
        Some(a) => match a.find('/') {
            Some(i) => (a[..i].to_string(), a[i..].to_string()),
            None => (a.to_string(), String::new()),
        },
        None => (String::new(), after.to_string()),
    };
    let host = host.rsplit_once('@').map_or(host.clone(), |(_, h)| h.to_string());
    Some(Url { scheme: scheme.to_string(), host, path, query })
}

fn url(args: &[Value]) -> Result<Value> {
    let s = string("url", args, 0)?;
    parse_url(s)
        .map(|u| Value::Opaque(Arc::new(u)))
        .ok_or_else(|| err("url", format!("URL parse error during conversion from string: {s}")))
}
fn is_url(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(parse_url(string("isURL", args, 0)?).is_some()))
}
overload!(url_o, url);
overload!(is_url_o, is_url);

fn url_arg<'a>(function: &str, args: &'a [Value]) -> Result<&'a Url> {
    match args.first() {
        Some(Value::Opaque(o)) => {
            o.downcast_ref::<Url>().ok_or_else(|| no_overload(function, args))
        }
        _ => Err(no_overload(function, args)),
    }
}

fn url_scheme(args: &[Value]) -> Result<Value> {
    Ok(Value::from(url_arg("getScheme", args)?.scheme.clone()))
}
fn url_host(args: &[Value]) -> Result<Value> {
    Ok(Value::from(url_arg("getHost", args)?.host.clone()))
}
/// The host without the port (and an IPv6 address without its brackets).
fn hostname(host: &str) -> (&str, &str) {
    if let Some(rest) = host.strip_prefix('[') {
        let end = rest.find(']').unwrap_or(rest.len());
        let port = rest[end..].strip_prefix("]:").unwrap_or_default();
        return (&rest[..end], port);
    }
    match host.rsplit_once(':') {
        Some((h, p)) => (h, p),
        None => (host, ""),
    }
}
fn url_hostname(args: &[Value]) -> Result<Value> {
    Ok(Value::from(hostname(&url_arg("getHostname", args)?.host).0.to_string()))
}
fn url_port(args: &[Value]) -> Result<Value> {
    Ok(Value::from(hostname(&url_arg("getPort", args)?.host).1.to_string()))
}
fn url_path(args: &[Value]) -> Result<Value> {
    Ok(Value::from(url_arg("getEscapedPath", args)?.path.clone()))
}
/// The query as a map of each key to its values.
fn url_query(args: &[Value]) -> Result<Value> {
    let q = &url_arg("getQuery", args)?.query;
    let mut m: std::collections::HashMap<String, Vec<Value>> = Default::default();
    for part in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = part.split_once('=').unwrap_or((part, ""));
        m.entry(k.to_string()).or_default().push(Value::from(v.to_string()));
    }
    Ok(Value::from(m))
}
overload!(url_scheme_o, url_scheme);
overload!(url_host_o, url_host);
overload!(url_hostname_o, url_hostname);
overload!(url_port_o, url_port);
overload!(url_path_o, url_path);
overload!(url_query_o, url_query);

// ---------------------------------------------------------------------------------------
// IP addresses and CIDRs

#[derive(Debug, Clone, PartialEq, Eq)]
struct Ip(IpAddr);

impl Opaque for Ip {
    fn runtime_type_name(&self) -> &str {
        "net.IP"
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Cidr {
    ip: IpAddr,
    prefix: u8,
}

impl Opaque for Cidr {
    fn runtime_type_name(&self) -> &str {
        "net.CIDR"
    }
}

/// Upstream's `ip()` refuses IPv4-mapped IPv6 addresses and zones.
fn parse_ip(s: &str) -> Option<IpAddr> {
    let ip: IpAddr = s.parse().ok()?;
    if let IpAddr::V6(v6) = ip
        && v6.to_ipv4_mapped().is_some()
    {
        return None;
    }
    Some(ip)
}

fn parse_cidr(s: &str) -> Option<Cidr> {
    let (ip, prefix) = s.split_once('/')?;
    let ip = parse_ip(ip)?;
    let prefix: u8 = prefix.parse().ok()?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    (prefix <= max).then_some(Cidr { ip, prefix })
}

fn ip(args: &[Value]) -> Result<Value> {
    let s = string("ip", args, 0)?;
    parse_ip(s).map(|i| Value::Opaque(Arc::new(Ip(i)))).ok_or_else(|| {
        err("ip", format!("IP Address {s:?} parse error during conversion from string"))
    })
}
fn is_ip(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(parse_ip(string("isIP", args, 0)?).is_some()))
}
fn ip_is_canonical(args: &[Value]) -> Result<Value> {
    let s = string("ip.isCanonical", args, 0)?;
    let ip = parse_ip(s).ok_or_else(|| err("ip.isCanonical", "invalid ip"))?;
    Ok(Value::Bool(ip.to_string() == s))
}
fn cidr(args: &[Value]) -> Result<Value> {
    let s = string("cidr", args, 0)?;
    parse_cidr(s).map(|c| Value::Opaque(Arc::new(c))).ok_or_else(|| {
        err("cidr", format!("network address parse error during conversion from string: {s}"))
    })
}
fn is_cidr(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(parse_cidr(string("isCIDR", args, 0)?).is_some()))
}
overload!(ip_o, ip);
overload!(is_ip_o, is_ip);
overload!(ip_is_canonical_o, ip_is_canonical);
overload!(cidr_o, cidr);
overload!(is_cidr_o, is_cidr);

fn ip_arg(function: &str, args: &[Value], i: usize) -> Result<IpAddr> {
    match args.get(i) {
        Some(Value::Opaque(o)) => {
            o.downcast_ref::<Ip>().map(|i| i.0).ok_or_else(|| no_overload(function, args))
        }
        Some(Value::String(s)) if i > 0 => parse_ip(s).ok_or_else(|| err(function, "invalid ip")),
        _ => Err(no_overload(function, args)),
    }
}
fn cidr_arg(function: &str, args: &[Value], i: usize) -> Result<Cidr> {
    match args.get(i) {
        Some(Value::Opaque(o)) => {
            o.downcast_ref::<Cidr>().cloned().ok_or_else(|| no_overload(function, args))
        }
        Some(Value::String(s)) if i > 0 => {
            parse_cidr(s).ok_or_else(|| err(function, "invalid cidr"))
        }
        _ => Err(no_overload(function, args)),
    }
}

fn family(args: &[Value]) -> Result<Value> {
    let ip = match args.first() {
        Some(Value::Opaque(o)) if o.downcast_ref::<Cidr>().is_some() => {
            cidr_arg("family", args, 0)?.ip
        }
        _ => ip_arg("family", args, 0)?,
    };
    Ok(Value::Int(if ip.is_ipv4() { 4 } else { 6 }))
}
fn is_unspecified(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(ip_arg("isUnspecified", args, 0)?.is_unspecified()))
}
fn is_loopback(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(ip_arg("isLoopback", args, 0)?.is_loopback()))
}
fn is_ll_multicast(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(match ip_arg("isLinkLocalMulticast", args, 0)? {
        IpAddr::V4(v) => v.octets()[..3] == [224, 0, 0],
        IpAddr::V6(v) => v.segments()[0] & 0xff0f == 0xff02,
    }))
}
fn is_ll_unicast(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(match ip_arg("isLinkLocalUnicast", args, 0)? {
        IpAddr::V4(v) => v.is_link_local(),
        IpAddr::V6(v) => v.segments()[0] & 0xffc0 == 0xfe80,
    }))
}
/// Go's `IP.IsGlobalUnicast`: not unspecified, loopback, multicast, link-local or the
/// IPv4 broadcast address.
fn is_global_unicast(args: &[Value]) -> Result<Value> {
    let ip = ip_arg("isGlobalUnicast", args, 0)?;
    let link_local = match ip {
        IpAddr::V4(v) => v.is_link_local() || v.is_broadcast(),
        IpAddr::V6(v) => v.segments()[0] & 0xffc0 == 0xfe80,
    };
    Ok(Value::Bool(!(ip.is_unspecified() || ip.is_loopback() || ip.is_multicast() || link_local)))
}
overload!(family_o, family);
overload!(is_unspecified_o, is_unspecified);
overload!(is_loopback_o, is_loopback);
overload!(is_ll_multicast_o, is_ll_multicast);
overload!(is_ll_unicast_o, is_ll_unicast);
overload!(is_global_unicast_o, is_global_unicast);

fn bits(ip: IpAddr) -> (u128, u8) {
    match ip {
        IpAddr::V4(v) => (u128::from(u32::from(v)), 32),
        IpAddr::V6(v) => (u128::from(v), 128),
    }
}

fn in_prefix(c: &Cidr, ip: IpAddr) -> bool {
    if c.ip.is_ipv4() != ip.is_ipv4() {
        return false;
    }
    let (a, width) = bits(c.ip);
    let (b, _) = bits(ip);
    let shift = u32::from(width - c.prefix);
    if shift >= 128 {
        return true;
    }
    (a >> shift) == (b >> shift)
}

fn contains_ip(args: &[Value]) -> Result<Value> {
    let c = cidr_arg("containsIP", args, 0)?;
    Ok(Value::Bool(in_prefix(&c, ip_arg("containsIP", args, 1)?)))
}
fn contains_cidr(args: &[Value]) -> Result<Value> {
    let c = cidr_arg("containsCIDR", args, 0)?;
    let other = cidr_arg("containsCIDR", args, 1)?;
    Ok(Value::Bool(other.prefix >= c.prefix && in_prefix(&c, other.ip)))
}
fn prefix_length(args: &[Value]) -> Result<Value> {
    Ok(Value::Int(i64::from(cidr_arg("prefixLength", args, 0)?.prefix)))
}
fn masked(args: &[Value]) -> Result<Value> {
    let c = cidr_arg("masked", args, 0)?;
    let (a, width) = bits(c.ip);
    let shift = u32::from(width - c.prefix);
    let m = if shift >= 128 { 0 } else { (a >> shift) << shift };
    let ip = match c.ip {
        IpAddr::V4(_) => IpAddr::V4((m as u32).into()),
        IpAddr::V6(_) => IpAddr::V6(m.into()),
    };
    Ok(Value::Opaque(Arc::new(Cidr { ip, prefix: c.prefix })))
}
fn cidr_ip(args: &[Value]) -> Result<Value> {
    Ok(Value::Opaque(Arc::new(Ip(cidr_arg("ip", args, 0)?.ip))))
}
overload!(contains_ip_o, contains_ip);
overload!(contains_cidr_o, contains_cidr);
overload!(prefix_length_o, prefix_length);
overload!(masked_o, masked);
overload!(cidr_ip_o, cidr_ip);

// ---------------------------------------------------------------------------------------
// Quantities

/// A resource quantity (`1Gi`, `500m`, `1e3`) as an exact decimal: `units * 10^-9`
/// (nano units, as the smallest suffix `n`), enough for the quantities rules compare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Quantity(i128);

impl Opaque for Quantity {
    fn runtime_type_name(&self) -> &str {
        "kubernetes.Quantity"
    }
}

const NANO: i128 = 1_000_000_000;

/// Parses a quantity in upstream's canonical grammar: sign, digits with an optional
/// fraction, then a binary (`Ki`..`Ei`) or decimal (`n`, `u`, `m`, `k`, `M`..`E`) suffix
/// or an exponent (`e3`, `E-2`).
fn parse_quantity(s: &str) -> Option<Quantity> {
    let (neg, body) = match s.as_bytes().first()? {
        b'-' => (true, &s[1..]),
        b'+' => (false, &s[1..]),
        _ => (false, s),
    };
    let num_end = body.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(body.len());
    let (num, suffix) = body.split_at(num_end);
    if num.is_empty() || num == "." || num.matches('.').count() > 1 {
        return None;
    }
    let (int_part, frac_part) = num.split_once('.').unwrap_or((num, ""));
    let digits = format!("{int_part}{frac_part}");
    let mantissa: i128 = digits.parse().ok()?;
    // value = mantissa * 10^(-frac_len) * multiplier
    let mut scale10: i32 = -(frac_part.len() as i32);
    let mut mult2: u32 = 0;
    match suffix {
        "" => {}
        "n" => scale10 -= 9,
        "u" => scale10 -= 6,
        "m" => scale10 -= 3,
        "k" => scale10 += 3,
        "M" => scale10 += 6,
        "G" => scale10 += 9,
        "T" => scale10 += 12,
        "P" => scale10 += 15,
        "E" => scale10 += 18,
        "Ki" => mult2 = 10,
        "Mi" => mult2 = 20,
        "Gi" => mult2 = 30,
        "Ti" => mult2 = 40,
        "Pi" => mult2 = 50,
        "Ei" => mult2 = 60,
        e if e.starts_with(['e', 'E']) => scale10 += e[1..].parse::<i32>().ok()?,
        _ => return None,
    }
    let mut v = mantissa.checked_mul(NANO)?.checked_mul(1i128.checked_shl(mult2)?)?;
    if scale10 >= 0 {
        v = v.checked_mul(10i128.checked_pow(scale10 as u32)?)?;
    } else {
        // Rounded up to the nano unit, as upstream rounds a quantity's scale.
        let d = 10i128.checked_pow((-scale10) as u32)?;
        v = (v + d - 1) / d;
    }
    Some(Quantity(if neg { -v } else { v }))
}

fn quantity_of(v: &Value) -> Option<Quantity> {
    match v {
        Value::Opaque(o) => o.downcast_ref::<Quantity>().copied(),
        _ => None,
    }
}

fn quantity(args: &[Value]) -> Result<Value> {
    let s = string("quantity", args, 0)?;
    parse_quantity(s)
        .map(|q| Value::Opaque(Arc::new(q)))
        .ok_or_else(|| err("quantity", "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"))
}
fn is_quantity(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(parse_quantity(string("isQuantity", args, 0)?).is_some()))
}
overload!(quantity_o, quantity);
overload!(is_quantity_o, is_quantity);

fn q_arg(function: &str, args: &[Value], i: usize) -> Result<Quantity> {
    match args.get(i) {
        Some(Value::Int(n)) if i > 0 => Ok(Quantity(i128::from(*n) * NANO)),
        Some(v) => quantity_of(v).ok_or_else(|| no_overload(function, args)),
        None => Err(no_overload(function, args)),
    }
}
fn q_sign(args: &[Value]) -> Result<Value> {
    Ok(Value::Int(q_arg("sign", args, 0)?.0.signum() as i64))
}
fn q_is_integer(args: &[Value]) -> Result<Value> {
    let q = q_arg("isInteger", args, 0)?;
    Ok(Value::Bool(q.0 % NANO == 0 && i64::try_from(q.0 / NANO).is_ok()))
}
fn q_as_integer(args: &[Value]) -> Result<Value> {
    let q = q_arg("asInteger", args, 0)?;
    if q.0 % NANO != 0 {
        return Err(err("asInteger", "cannot convert value to integer"));
    }
    i64::try_from(q.0 / NANO)
        .map(Value::Int)
        .map_err(|_| err("asInteger", "cannot convert value to integer"))
}
fn q_as_float(args: &[Value]) -> Result<Value> {
    Ok(Value::Float(q_arg("asApproximateFloat", args, 0)?.0 as f64 / NANO as f64))
}
fn q_add(args: &[Value]) -> Result<Value> {
    let (a, b) = (q_arg("add", args, 0)?, q_arg("add", args, 1)?);
    Ok(Value::Opaque(Arc::new(Quantity(a.0 + b.0))))
}
fn q_sub(args: &[Value]) -> Result<Value> {
    let (a, b) = (q_arg("sub", args, 0)?, q_arg("sub", args, 1)?);
    Ok(Value::Opaque(Arc::new(Quantity(a.0 - b.0))))
}
fn q_less(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(q_arg("isLessThan", args, 0)? < q_arg("isLessThan", args, 1)?))
}
fn q_greater(args: &[Value]) -> Result<Value> {
    Ok(Value::Bool(q_arg("isGreaterThan", args, 0)? > q_arg("isGreaterThan", args, 1)?))
}
fn q_compare(args: &[Value]) -> Result<Value> {
    let o = q_arg("compareTo", args, 0)?.cmp(&q_arg("compareTo", args, 1)?);
    Ok(Value::Int(o as i64))
}
overload!(q_sign_o, q_sign);
overload!(q_is_integer_o, q_is_integer);
overload!(q_as_integer_o, q_as_integer);
overload!(q_as_float_o, q_as_float);
overload!(q_add_o, q_add);
overload!(q_sub_o, q_sub);
overload!(q_less_o, q_less);
overload!(q_greater_o, q_greater);
overload!(q_compare_o, q_compare);

// ---------------------------------------------------------------------------------------
// Sets

fn two_lists<'a>(function: &str, args: &'a [Value]) -> Result<(&'a [Value], &'a [Value])> {
    match (args.first(), args.get(1)) {
        (Some(Value::List(a)), Some(Value::List(b))) => Ok((a, b)),
        _ => Err(no_overload(function, args)),
    }
}
fn sets_contains(args: &[Value]) -> Result<Value> {
    let (a, b) = two_lists("sets.contains", args)?;
    Ok(Value::Bool(b.iter().all(|x| a.contains(x))))
}
fn sets_equivalent(args: &[Value]) -> Result<Value> {
    let (a, b) = two_lists("sets.equivalent", args)?;
    Ok(Value::Bool(b.iter().all(|x| a.contains(x)) && a.iter().all(|x| b.contains(x))))
}
fn sets_intersects(args: &[Value]) -> Result<Value> {
    let (a, b) = two_lists("sets.intersects", args)?;
    Ok(Value::Bool(b.iter().any(|x| a.contains(x))))
}
overload!(sets_contains_o, sets_contains);
overload!(sets_equivalent_o, sets_equivalent);
overload!(sets_intersects_o, sets_intersects);
