//! The record index the server answers from: records by owner name, each tagged with the
//! object that produced it so one Service's or Pod's records are replaced as a unit when
//! its watch events arrive. Knows which names exist (for NXDOMAIN versus NODATA).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use hickory_proto::rr::{Name, RData, RecordType};

use super::records::Rr;

/// The object a record comes from.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    Service { namespace: String, name: String },
    Pod { namespace: String, name: String },
}

/// What the zone says about a name and type.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    /// Records of the asked type (or the CNAME at the name).
    Records(Vec<(Name, RData)>),
    /// The name exists in the cluster zone but has no record of that type.
    NoData,
    /// No such name in the cluster zone.
    NxDomain,
    /// Not the cluster zone's to answer (forward it).
    NotOurs,
}

#[derive(Debug)]
pub struct Zone {
    apex: Name,
    names: HashMap<Name, Vec<(Arc<Owner>, RData)>>,
    owned: HashMap<Arc<Owner>, Vec<Name>>,
    /// Names between a record's name and the apex (empty non-terminals), counted.
    ancestors: HashMap<Name, u32>,
}

impl Zone {
    /// An empty zone for `apex` (e.g. `cluster.local.`).
    pub fn new(apex: Name) -> Self {
        Zone { apex, names: HashMap::new(), owned: HashMap::new(), ancestors: HashMap::new() }
    }

    pub fn apex(&self) -> &Name {
        &self.apex
    }

    /// Number of owner names held (records are grouped under them).
    pub fn name_count(&self) -> usize {
        self.names.len()
    }

    /// Whether `name` is at or below the apex.
    pub fn contains(&self, name: &Name) -> bool {
        self.apex.zone_of(name)
    }

    /// Replaces every record of `owner` by `records` (none: removes the owner).
    pub fn replace(&mut self, owner: Owner, records: Vec<Rr>) {
        self.remove(&owner);
        if records.is_empty() {
            return;
        }
        let owner = Arc::new(owner);
        let mut names = Vec::with_capacity(records.len());
        let mut seen = HashSet::with_capacity(records.len());
        for rr in records {
            if seen.insert(rr.name.clone()) {
                names.push(rr.name.clone());
                if self.apex.zone_of(&rr.name) {
                    for anc in ancestors_below(&self.apex, &rr.name) {
                        *self.ancestors.entry(anc).or_insert(0) += 1;
                    }
                }
            }
            self.names.entry(rr.name).or_default().push((owner.clone(), rr.data));
        }
        self.owned.insert(owner, names);
    }

    /// Removes every record of `owner`.
    pub fn remove(&mut self, owner: &Owner) {
        let Some(names) = self.owned.remove(owner) else { return };
        for name in names {
            if let Some(entries) = self.names.get_mut(&name) {
                entries.retain(|(o, _)| o.as_ref() != owner);
                if entries.is_empty() {
                    self.names.remove(&name);
                }
            }
            if self.apex.zone_of(&name) {
                for anc in ancestors_below(&self.apex, &name) {
                    if let Some(count) = self.ancestors.get_mut(&anc) {
                        *count -= 1;
                        if *count == 0 {
                            self.ancestors.remove(&anc);
                        }
                    }
                }
            }
        }
    }

    /// Answers `qtype` at `name`. Reverse names the zone holds are answered; others are
    /// [`Lookup::NotOurs`] like every name outside the apex.
    pub fn lookup(&self, name: &Name, qtype: RecordType) -> Lookup {
        let ours = self.apex.zone_of(name);
        let Some(entries) = self.names.get(name) else {
            if !ours {
                return Lookup::NotOurs;
            }
            return if name == &self.apex || self.ancestors.contains_key(name) {
                Lookup::NoData
            } else {
                Lookup::NxDomain
            };
        };
        let wanted = |data: &RData| qtype == RecordType::ANY || data.record_type() == qtype;
        let mut found: Vec<(Name, RData)> = Vec::new();
        // Reverse names: an address that is both a service endpoint and a pod answers
        // with the service's name only (as CoreDNS does).
        let service_ptr = qtype == RecordType::PTR
            && entries.iter().any(|(o, d)| matches!(**o, Owner::Service { .. }) && wanted(d));
        for (owner, data) in entries {
            if service_ptr && matches!(**owner, Owner::Pod { .. }) {
                continue;
            }
            if wanted(data) && !found.iter().any(|(_, d)| d == data) {
                found.push((name.clone(), data.clone()));
            }
        }
        if found.is_empty()
            && let Some((_, cname)) =
                entries.iter().find(|(_, d)| d.record_type() == RecordType::CNAME)
        {
            found.push((name.clone(), cname.clone()));
        }
        if found.is_empty() {
            if ours { Lookup::NoData } else { Lookup::NotOurs }
        } else {
            Lookup::Records(found)
        }
    }
}

/// The names strictly between `apex` and `name` (`name` excluded): for
/// `_http._tcp.web.shop.svc.cluster.local.` under `cluster.local.` that is
/// `_tcp.web...`, `web.shop...`, `shop.svc...` and `svc.cluster.local.`.
fn ancestors_below(apex: &Name, name: &Name) -> Vec<Name> {
    let mut out = Vec::new();
    let (labels, apex_labels) = (name.num_labels(), apex.num_labels());
    let mut n = labels.saturating_sub(1);
    while n > apex_labels {
        out.push(name.trim_to(n as usize));
        n -= 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::rr::rdata::{A, PTR};

    fn n(s: &str) -> Name {
        Name::from_ascii(s).unwrap()
    }

    fn svc(name: &str) -> Owner {
        Owner::Service { namespace: "shop".into(), name: name.into() }
    }

    fn a(name: &str, ip: &str) -> Rr {
        Rr { name: n(name), data: RData::A(A(ip.parse().unwrap())) }
    }

    #[test]
    fn nxdomain_nodata_and_not_ours() {
        let mut z = Zone::new(n("cluster.local."));
        z.replace(svc("web"), vec![a("web.shop.svc.cluster.local.", "10.96.0.1")]);
        assert!(
            matches!(z.lookup(&n("WEB.shop.svc.cluster.local."), RecordType::A), Lookup::Records(r) if r.len() == 1)
        );
        assert_eq!(z.lookup(&n("web.shop.svc.cluster.local."), RecordType::AAAA), Lookup::NoData);
        assert_eq!(z.lookup(&n("shop.svc.cluster.local."), RecordType::A), Lookup::NoData);
        assert_eq!(z.lookup(&n("cluster.local."), RecordType::A), Lookup::NoData);
        assert_eq!(z.lookup(&n("db.shop.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(z.lookup(&n("example.org."), RecordType::A), Lookup::NotOurs);
        z.remove(&svc("web"));
        assert_eq!(z.lookup(&n("web.shop.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert_eq!(z.lookup(&n("shop.svc.cluster.local."), RecordType::A), Lookup::NxDomain);
        assert!(z.ancestors.is_empty() && z.names.is_empty());
    }

    #[test]
    fn replace_swaps_an_owners_records_and_keeps_others() {
        let mut z = Zone::new(n("cluster.local."));
        z.replace(svc("web"), vec![a("web.shop.svc.cluster.local.", "10.96.0.1")]);
        z.replace(svc("db"), vec![a("db.shop.svc.cluster.local.", "10.96.0.2")]);
        z.replace(svc("web"), vec![a("web.shop.svc.cluster.local.", "10.96.0.3")]);
        assert_eq!(
            z.lookup(&n("web.shop.svc.cluster.local."), RecordType::A),
            Lookup::Records(vec![(
                n("web.shop.svc.cluster.local."),
                RData::A(A("10.96.0.3".parse().unwrap()))
            )])
        );
        assert!(matches!(
            z.lookup(&n("db.shop.svc.cluster.local."), RecordType::A),
            Lookup::Records(_)
        ));
        z.remove(&svc("db"));
        assert_eq!(z.lookup(&n("shop.svc.cluster.local."), RecordType::A), Lookup::NoData);
    }

    #[test]
    fn reverse_prefers_the_service_name_over_the_pod_name() {
        let mut z = Zone::new(n("cluster.local."));
        let rev = n("5.1.244.10.in-addr.arpa.");
        z.replace(
            Owner::Pod { namespace: "shop".into(), name: "p".into() },
            vec![Rr {
                name: rev.clone(),
                data: RData::PTR(PTR(n("10-244-1-5.shop.pod.cluster.local."))),
            }],
        );
        assert!(matches!(z.lookup(&rev, RecordType::PTR), Lookup::Records(r) if r.len() == 1));
        z.replace(
            svc("web"),
            vec![Rr {
                name: rev.clone(),
                data: RData::PTR(PTR(n("web-0.web.shop.svc.cluster.local."))),
            }],
        );
        assert_eq!(
            z.lookup(&rev, RecordType::PTR),
            Lookup::Records(vec![(
                rev.clone(),
                RData::PTR(PTR(n("web-0.web.shop.svc.cluster.local.")))
            )])
        );
        assert_eq!(z.lookup(&n("6.1.244.10.in-addr.arpa."), RecordType::PTR), Lookup::NotOurs);
    }
}
