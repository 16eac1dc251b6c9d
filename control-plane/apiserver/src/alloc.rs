//! ClusterIP and NodePort allocation for Services. The allocations are the Services
//! themselves: at start the allocators are rebuilt from the stored Services (the repair
//! upstream's repair controllers do), and each allocation is reserved in memory before the
//! Service is written and released if the write fails.

use std::collections::BTreeSet;
use std::net::Ipv4Addr;

use skiff_core::cidr::Cidr;
use std::sync::Mutex;

use serde_json::Value;

use super::status::{ApiError, ApiResult};

/// Allocators for ClusterIPs and NodePorts.
pub struct Allocators {
    pub service_cidr: Cidr,
    pub node_ports: (u16, u16),
    ips: Mutex<BTreeSet<Ipv4Addr>>,
    ports: Mutex<BTreeSet<u16>>,
}

impl Allocators {
    pub fn new(service_cidr: Cidr, node_ports: (u16, u16)) -> Self {
        Allocators {
            service_cidr,
            node_ports,
            ips: Mutex::new(BTreeSet::new()),
            ports: Mutex::new(BTreeSet::new()),
        }
    }

    /// The first address of the range, reserved for the `kubernetes` Service.
    pub fn kubernetes_ip(&self) -> Ipv4Addr {
        self.service_cidr.nth(1)
    }

    /// Rebuild from the stored Services.
    pub fn repair<'a>(&self, services: impl IntoIterator<Item = &'a Value>) {
        let mut ips = self.ips.lock().unwrap_or_else(|e| e.into_inner());
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        ips.clear();
        ports.clear();
        for svc in services {
            for ip in service_ips(svc) {
                ips.insert(ip);
            }
            for port in service_node_ports(svc) {
                ports.insert(port);
            }
        }
    }

    /// Allocate what a new Service needs, writing the chosen values into it. Returns what
    /// was reserved so a failed write can release it.
    pub fn allocate(&self, svc: &mut Value) -> ApiResult<Reservation> {
        let mut res = Reservation::default();
        let svc_type =
            svc.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP").to_string();
        if svc_type != "ExternalName" {
            let requested =
                svc.pointer("/spec/clusterIP").and_then(Value::as_str).unwrap_or("").to_string();
            match requested.as_str() {
                "None" => {}
                "" => {
                    let ip = self.allocate_ip(None)?;
                    res.ips.push(ip);
                    set_cluster_ip(svc, &ip.to_string());
                }
                other => {
                    let ip: Ipv4Addr = other.parse().map_err(|_| invalid_ip(other))?;
                    let ip = match self.allocate_ip(Some(ip)) {
                        Ok(ip) => ip,
                        Err(e) => {
                            self.release(&res);
                            return Err(e);
                        }
                    };
                    res.ips.push(ip);
                    set_cluster_ip(svc, &ip.to_string());
                }
            }
            if svc.pointer("/spec/clusterIP").and_then(Value::as_str) != Some("None")
                && let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut)
            {
                spec.entry("ipFamilies").or_insert_with(|| serde_json::json!(["IPv4"]));
                spec.entry("ipFamilyPolicy").or_insert_with(|| serde_json::json!("SingleStack"));
            }
        }
        if matches!(svc_type.as_str(), "NodePort" | "LoadBalancer")
            && let Err(e) = self.allocate_node_ports(svc, &mut res, &[])
        {
            self.release(&res);
            return Err(e);
        }
        Ok(res)
    }

    /// Allocate for an updated Service (new NodePorts when the type changed, etc.).
    pub fn allocate_update(&self, svc: &mut Value, old: &Value) -> ApiResult<Reservation> {
        let mut res = Reservation::default();
        let svc_type =
            svc.pointer("/spec/type").and_then(Value::as_str).unwrap_or("ClusterIP").to_string();
        let old_ip =
            old.pointer("/spec/clusterIP").and_then(Value::as_str).unwrap_or("").to_string();
        if svc_type != "ExternalName"
            && svc.pointer("/spec/clusterIP").and_then(Value::as_str).unwrap_or("").is_empty()
        {
            if old_ip.is_empty() {
                let ip = self.allocate_ip(None)?;
                res.ips.push(ip);
                set_cluster_ip(svc, &ip.to_string());
            } else {
                set_cluster_ip(svc, &old_ip);
            }
        }
        if matches!(svc_type.as_str(), "NodePort" | "LoadBalancer") {
            // Keep the ports the Service already had for the same port.
            let old_ports = service_node_ports(old);
            if let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) {
                let old_list = old
                    .pointer("/spec/ports")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                for p in ports.iter_mut() {
                    if p.get("nodePort").and_then(Value::as_u64).unwrap_or(0) == 0
                        && let Some(prev) = old_list.iter().find(|o| o.get("port") == p.get("port"))
                        && let Some(np) =
                            prev.get("nodePort").filter(|n| n.as_u64().unwrap_or(0) != 0)
                    {
                        p["nodePort"] = np.clone();
                    }
                }
            }
            let mut taken = self.ports.lock().unwrap_or_else(|e| e.into_inner());
            for port in service_node_ports(svc) {
                if !old_ports.contains(&port) {
                    if !taken.insert(port) {
                        drop(taken);
                        self.release(&res);
                        return Err(port_taken(port));
                    }
                    res.ports.push(port);
                }
            }
            drop(taken);
            if let Err(e) = self.allocate_node_ports(svc, &mut res, &old_ports) {
                self.release(&res);
                return Err(e);
            }
        }
        Ok(res)
    }

    fn allocate_ip(&self, want: Option<Ipv4Addr>) -> ApiResult<Ipv4Addr> {
        let mut ips = self.ips.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ip) = want {
            if !self.service_cidr.contains(ip) {
                return Err(ApiError::invalid(
                    format!(
                        "spec.clusterIPs: Invalid value: \"{ip}\": provided IP is not in the valid range. The range of valid IPs is {}",
                        self.service_cidr
                    ),
                    vec![],
                ));
            }
            if !ips.insert(ip) {
                return Err(ApiError::invalid(
                    format!(
                        "spec.clusterIPs: Invalid value: \"{ip}\": failed to allocate IP {ip}: provided IP is already allocated"
                    ),
                    vec![],
                ));
            }
            return Ok(ip);
        }
        // Skip the network address, the kubernetes Service's address and the broadcast address.
        let size = self.service_cidr.size();
        let start = rand_u64() % size.max(1);
        for i in 0..size {
            let n = (start + i) % size;
            if n < 2 || n == size - 1 {
                continue;
            }
            let ip = self.service_cidr.nth(n);
            if ips.insert(ip) {
                return Ok(ip);
            }
        }
        Err(ApiError::internal(format!(
            "failed to allocate a serviceIP: range {} is full",
            self.service_cidr
        )))
    }

    /// Allocate ports for the Service's ports without one; check explicit ones. `owned` are
    /// ports the Service already holds (an update keeping them).
    fn allocate_node_ports(
        &self,
        svc: &mut Value,
        res: &mut Reservation,
        owned: &[u16],
    ) -> ApiResult<()> {
        let Some(ports) = svc.pointer_mut("/spec/ports").and_then(Value::as_array_mut) else {
            return Ok(());
        };
        let mut taken = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        for p in ports.iter_mut() {
            match p.get("nodePort").and_then(Value::as_u64).unwrap_or(0) {
                0 => {
                    let (lo, hi) = self.node_ports;
                    let span = u64::from(hi - lo) + 1;
                    let start = rand_u64() % span;
                    let port = (0..span)
                        .map(|i| lo + ((start + i) % span) as u16)
                        .find(|port| !taken.contains(port))
                        .ok_or_else(|| {
                            ApiError::internal("failed to allocate a nodePort: range is full")
                        })?;
                    taken.insert(port);
                    res.ports.push(port);
                    p["nodePort"] = Value::from(port);
                }
                port => {
                    let port = port as u16;
                    if res.ports.contains(&port) || owned.contains(&port) {
                        continue;
                    }
                    if port < self.node_ports.0 || port > self.node_ports.1 {
                        return Err(ApiError::invalid(
                            format!(
                                "spec.ports[].nodePort: Invalid value: {port}: provided port is not in the valid range. The range of valid ports is {}-{}",
                                self.node_ports.0, self.node_ports.1
                            ),
                            vec![],
                        ));
                    }
                    if !taken.insert(port) {
                        return Err(port_taken(port));
                    }
                    res.ports.push(port);
                }
            }
        }
        Ok(())
    }

    pub fn release(&self, res: &Reservation) {
        let mut ips = self.ips.lock().unwrap_or_else(|e| e.into_inner());
        for ip in &res.ips {
            ips.remove(ip);
        }
        drop(ips);
        let mut ports = self.ports.lock().unwrap_or_else(|e| e.into_inner());
        for p in &res.ports {
            ports.remove(p);
        }
    }

    /// Release what a deleted (or updated-away) Service held.
    pub fn release_service(&self, svc: &Value, keep: Option<&Value>) {
        let keep_ips: Vec<Ipv4Addr> = keep.map(service_ips).unwrap_or_default();
        let keep_ports: Vec<u16> = keep.map(service_node_ports).unwrap_or_default();
        let res = Reservation {
            ips: service_ips(svc).into_iter().filter(|ip| !keep_ips.contains(ip)).collect(),
            ports: service_node_ports(svc)
                .into_iter()
                .filter(|p| !keep_ports.contains(p))
                .collect(),
        };
        self.release(&res);
    }

    pub fn ip_in_use(&self, ip: Ipv4Addr) -> bool {
        self.ips.lock().unwrap_or_else(|e| e.into_inner()).contains(&ip)
    }
}

/// What one allocation reserved.
#[derive(Debug, Default, Clone)]
pub struct Reservation {
    pub ips: Vec<Ipv4Addr>,
    pub ports: Vec<u16>,
}

fn set_cluster_ip(svc: &mut Value, ip: &str) {
    if let Some(spec) = svc.get_mut("spec").and_then(Value::as_object_mut) {
        spec.insert("clusterIP".into(), Value::from(ip));
        spec.insert("clusterIPs".into(), serde_json::json!([ip]));
    }
}

fn service_ips(svc: &Value) -> Vec<Ipv4Addr> {
    let mut out: Vec<Ipv4Addr> = svc
        .pointer("/spec/clusterIPs")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(|v| v.as_str()?.parse().ok()).collect())
        .unwrap_or_default();
    if let Some(ip) =
        svc.pointer("/spec/clusterIP").and_then(Value::as_str).and_then(|s| s.parse().ok())
        && !out.contains(&ip)
    {
        out.push(ip);
    }
    out
}

fn service_node_ports(svc: &Value) -> Vec<u16> {
    svc.pointer("/spec/ports")
        .and_then(Value::as_array)
        .map(|ports| {
            ports
                .iter()
                .filter_map(|p| p.get("nodePort").and_then(Value::as_u64))
                .filter(|p| *p > 0 && *p <= u64::from(u16::MAX))
                .map(|p| p as u16)
                .collect()
        })
        .unwrap_or_default()
}

fn invalid_ip(ip: &str) -> ApiError {
    ApiError::invalid(
        format!("spec.clusterIPs: Invalid value: \"{ip}\": must be a valid IP address"),
        vec![],
    )
}

fn port_taken(port: u16) -> ApiError {
    ApiError::invalid(
        format!("spec.ports[].nodePort: Invalid value: {port}: provided port is already allocated"),
        vec![],
    )
}

fn rand_u64() -> u64 {
    let u = uuid::Uuid::new_v4();
    let b = u.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn allocates_and_repairs() {
        let a = Allocators::new(Cidr::parse("10.96.0.0/28").unwrap(), (30000, 30002));
        let mut s1 = json!({"spec": {"type": "NodePort", "ports": [{"port": 80}]}});
        a.allocate(&mut s1).unwrap();
        let ip: Ipv4Addr = s1["spec"]["clusterIP"].as_str().unwrap().parse().unwrap();
        assert!(a.service_cidr.contains(ip) && ip != a.kubernetes_ip());
        let np = s1["spec"]["ports"][0]["nodePort"].as_u64().unwrap();
        assert!((30000..=30002).contains(&np));

        let mut dup = json!({"spec": {"clusterIP": ip.to_string(), "ports": [{"port": 80}]}});
        assert_eq!(a.allocate(&mut dup).unwrap_err().code, 422);

        let fresh = Allocators::new(a.service_cidr, a.node_ports);
        fresh.repair([&s1]);
        assert!(fresh.ip_in_use(ip));
        let mut same_port =
            json!({"spec": {"type": "NodePort", "ports": [{"port": 81, "nodePort": np}]}});
        assert_eq!(fresh.allocate(&mut same_port).unwrap_err().code, 422);
        // An update that keeps the Service's ports and IP is no conflict.
        let mut again = s1.clone();
        fresh.allocate_update(&mut again, &s1).unwrap();
        assert_eq!(again["spec"]["ports"][0]["nodePort"], s1["spec"]["ports"][0]["nodePort"]);
        fresh.release_service(&s1, None);
        assert!(!fresh.ip_in_use(ip));
    }
}
