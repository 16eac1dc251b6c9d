//! Maglev lookup tables (Eisenbud et al., NSDI '16), computed in user space for external
//! frontends: every node derives the same table from the same backend set, so a flow lands on
//! the same backend whichever node it enters, and removing a backend moves few other flows.

use skiff_ebpf_common::{MAGLEV_M, MaglevTable};

fn fnv1a(data: &[u8], seed: u64) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64 ^ seed;
    for b in data {
        h ^= *b as u64;
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// The table for `backends`: (stable name, e.g. `ip:port`, and backend id). The order of the
/// input does not matter (names are sorted), so all nodes agree.
pub fn table(backends: &[(String, u32)]) -> MaglevTable {
    let mut t = MaglevTable { backend_ids: [0; MAGLEV_M], _pad: 0 };
    if backends.is_empty() {
        return t;
    }
    let mut sorted: Vec<&(String, u32)> = backends.iter().collect();
    sorted.sort();
    let m = MAGLEV_M as u64;
    let perm: Vec<(u64, u64)> = sorted
        .iter()
        .map(|(name, _)| {
            let offset = fnv1a(name.as_bytes(), 0x5bd1_e995) % m;
            let skip = fnv1a(name.as_bytes(), 0x1b87_3593) % (m - 1) + 1;
            (offset, skip)
        })
        .collect();
    let mut next = vec![0u64; sorted.len()];
    let mut filled = vec![false; MAGLEV_M];
    let mut n = 0;
    'fill: loop {
        for (i, (offset, skip)) in perm.iter().enumerate() {
            let mut c = ((offset + next[i] * skip) % m) as usize;
            while filled[c] {
                next[i] += 1;
                c = ((offset + next[i] * skip) % m) as usize;
            }
            filled[c] = true;
            t.backend_ids[c] = sorted[i].1;
            next[i] += 1;
            n += 1;
            if n == MAGLEV_M {
                break 'fill;
            }
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: u32) -> Vec<(String, u32)> {
        (1..=n).map(|i| (format!("10.0.0.{i}:8080"), i)).collect()
    }

    #[test]
    fn entries_are_spread_evenly() {
        let t = table(&names(5));
        for id in 1..=5 {
            let c = t.backend_ids.iter().filter(|x| **x == id).count();
            assert!((MAGLEV_M / 5 - 2..=MAGLEV_M / 5 + 2).contains(&c), "backend {id}: {c}");
        }
    }

    #[test]
    fn input_order_does_not_matter_and_removal_disrupts_little() {
        let mut rev = names(5);
        rev.reverse();
        assert_eq!(table(&names(5)), table(&rev));
        let before = table(&names(5));
        let after = table(&names(4));
        let moved = before
            .backend_ids
            .iter()
            .zip(after.backend_ids.iter())
            .filter(|(b, a)| **b != 5 && b != a)
            .count();
        assert!(moved < MAGLEV_M / 10, "{moved} entries of kept backends moved");
    }
}
