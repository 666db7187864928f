//! Which member of a peer cache group owns a block: rendezvous (highest random weight)
//! hashing over the members' addresses, so that every member that knows the same members
//! picks the same owner, the group's caches add up (each block is cached at its owner), and
//! a member that leaves moves only the blocks it owned.
//!
//! Not for: who the members are (`volume` learns them from the sessions) or what is asked
//! of the owner (`peers::ask`).

use std::net::SocketAddr;

/// The weight of `member` for block `key`: the first 8 bytes of SHA-256 (ring's, the same
/// on every machine and every build) of both.
fn weight(member: &SocketAddr, key: &str) -> u64 {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(member.to_string().as_bytes());
    ctx.update(b"\0");
    ctx.update(key.as_bytes());
    let d = ctx.finish();
    let mut w = [0u8; 8];
    w.copy_from_slice(&d.as_ref()[..8]);
    u64::from_be_bytes(w)
}

/// The owner of block `key` among `members` (None: no member).
pub fn owner(key: &str, members: &[SocketAddr]) -> Option<SocketAddr> {
    members.iter().copied().max_by_key(|m| (weight(m, key), *m))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn members(n: u16) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| format!("10.0.0.{}:7600", i + 1).parse().unwrap())
            .collect()
    }

    #[test]
    fn blocks_spread_evenly_and_few_move_when_a_member_leaves() {
        let four = members(4);
        let keys: Vec<String> = (0..4000)
            .map(|i| format!("vol/chunks/{i}_0_4096"))
            .collect();
        let mut per = std::collections::HashMap::new();
        for k in &keys {
            *per.entry(owner(k, &four).unwrap()).or_insert(0) += 1;
        }
        // Each of four members owns about a quarter.
        assert!(per.values().all(|&n| (800..1200).contains(&n)), "{per:?}");
        // The order members are known in does not matter.
        let mut shuffled = four.clone();
        shuffled.reverse();
        assert!(keys.iter().all(|k| owner(k, &four) == owner(k, &shuffled)));
        // One leaves: only its blocks move.
        let three = &four[..3];
        let moved = keys
            .iter()
            .filter(|k| owner(k, &four) != owner(k, three))
            .count();
        assert_eq!(moved, per[&four[3]]);
        assert_eq!(owner("k", &[]), None);
    }
}
