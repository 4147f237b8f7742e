//! Which node owns each partition and which follow it as standbys: what the coordinator writes
//! to the partition map (`docs/cluster.md`, "Leases and fencing"). A new assignment starts from
//! the current one and moves as little as it can: replicas on nodes still present stay, an
//! owner that left is replaced by one of its standbys (a caught-up copy), and ownership is then
//! evened out, preferring a swap with a standby (a planned handover) to a move.

use std::collections::BTreeMap;

/// A node's id (`--node-id`).
pub type NodeId = String;

/// One partition's replicas.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replicas {
    pub owner: NodeId,
    /// In the order they contend when the owner's lease lapses.
    pub standbys: Vec<NodeId>,
}

impl Replicas {
    fn holds(&self, node: &str) -> bool {
        self.owner == node || self.standbys.iter().any(|s| s == node)
    }
}

/// Every partition's replicas, by partition number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assignment {
    pub partitions: Vec<Replicas>,
}

/// Counts per node, every node present (with 0).
struct Load<'a> {
    owned: BTreeMap<&'a str, usize>,
    held: BTreeMap<&'a str, usize>,
}

impl<'a> Load<'a> {
    fn of(nodes: &'a [NodeId], partitions: &[Replicas]) -> Self {
        let mut owned: BTreeMap<&str, usize> = nodes.iter().map(|n| (n.as_str(), 0)).collect();
        let mut held = owned.clone();
        for r in partitions {
            if let Some(n) = owned.get_mut(r.owner.as_str()) {
                *n += 1;
            }
            for node in std::iter::once(&r.owner).chain(&r.standbys) {
                if let Some(n) = held.get_mut(node.as_str()) {
                    *n += 1;
                }
            }
        }
        Load { owned, held }
    }

    /// The node with the most of `count` and the one with the least, if they differ by more
    /// than one (there is something to even out).
    fn uneven(count: &BTreeMap<&'a str, usize>) -> Option<(&'a str, &'a str)> {
        let (most, high) = count
            .iter()
            .max_by_key(|&(node, n)| (*n, std::cmp::Reverse(*node)))
            .expect("a node");
        let least = Self::least(count, |_| true).expect("a node");
        (*high > count[least] + 1).then_some((*most, least))
    }

    /// The node with the least of `count` among those `eligible`, by id on ties.
    fn least(count: &BTreeMap<&'a str, usize>, eligible: impl Fn(&str) -> bool) -> Option<&'a str> {
        count
            .iter()
            .filter(|(node, _)| eligible(node))
            .min_by_key(|&(node, n)| (*n, *node))
            .map(|(node, _)| *node)
    }
}

/// Up to `count` standbys for partition `partition` owned by `owner`, from `nodes` (the owner
/// left out), by rendezvous hashing: each node's score is xxh3-64 of the partition and its
/// id, highest first. Every node computes the same ranking, a node's departure moves only the
/// standby roles it had, and the roles spread evenly over the nodes.
pub fn ranked_standbys(
    partition: usize,
    owner: &str,
    nodes: &[NodeId],
    count: usize,
) -> Vec<NodeId> {
    let score = |node: &str| {
        let mut key = (partition as u64).to_le_bytes().to_vec();
        key.extend_from_slice(node.as_bytes());
        xxhash_rust::xxh3::xxh3_64(&key)
    };
    let mut ranked: Vec<&NodeId> = nodes.iter().filter(|n| *n != owner).collect();
    ranked.sort_by_key(|n| (std::cmp::Reverse(score(n)), n.as_str()));
    ranked.dedup();
    ranked.into_iter().take(count).cloned().collect()
}

/// The assignment of `partitions` partitions over `nodes` (at least one), each with `standbys`
/// standbys (fewer while there are fewer other nodes), starting from `current`.
pub fn assign(
    current: Option<&Assignment>,
    partitions: usize,
    nodes: &[NodeId],
    standbys: usize,
) -> Assignment {
    assert!(!nodes.is_empty(), "an assignment needs a node");
    let standbys = standbys.min(nodes.len() - 1);
    let present = |node: &str| nodes.iter().any(|n| n == node);
    // Keep what is on nodes still present; an owner that left gives way to its first standby.
    let mut out: Vec<Replicas> = (0..partitions)
        .map(|p| {
            let Some(r) = current.and_then(|c| c.partitions.get(p)) else {
                return Replicas {
                    owner: String::new(),
                    standbys: Vec::new(),
                };
            };
            let mut kept: Vec<NodeId> = Vec::new();
            for node in std::iter::once(&r.owner).chain(&r.standbys) {
                if present(node) && !kept.contains(node) {
                    kept.push(node.clone());
                }
            }
            if kept.is_empty() {
                return Replicas {
                    owner: String::new(),
                    standbys: Vec::new(),
                };
            }
            let owner = kept.remove(0);
            Replicas {
                owner,
                standbys: kept,
            }
        })
        .collect();

    // Owners for partitions that have none: the least-owning node.
    for p in 0..partitions {
        if out[p].owner.is_empty() {
            let load = Load::of(nodes, &out);
            let node = Load::least(&load.owned, |_| true).expect("a node");
            out[p].owner = node.to_string();
        }
    }

    // Even out ownership: from a most-owning node to a least-owning one, by a swap with that
    // node's standby role where it has one, else by a move (the old owner stays as a standby).
    while let Some((most, least)) = Load::uneven(&Load::of(nodes, &out).owned) {
        let owned_by_most = |p: &usize| out[*p].owner == most;
        let p = (0..partitions)
            .filter(owned_by_most)
            .find(|&p| out[p].standbys.iter().any(|s| s == least))
            .or_else(|| (0..partitions).rev().find(owned_by_most))
            .expect("the most-owning node owns one");
        let r = &mut out[p];
        let old = std::mem::replace(&mut r.owner, least.to_string());
        r.standbys.retain(|s| s != least);
        r.standbys.insert(0, old);
    }

    // Standbys: trim the extra ones (from the most-holding nodes), then fill up from the
    // least-holding nodes that do not hold the partition yet.
    for p in 0..partitions {
        while out[p].standbys.len() > standbys {
            let load = Load::of(nodes, &out);
            let (i, _) = out[p]
                .standbys
                .iter()
                .enumerate()
                .max_by_key(|(i, s)| (load.held[s.as_str()], *i))
                .expect("a standby");
            out[p].standbys.remove(i);
        }
        while out[p].standbys.len() < standbys {
            let load = Load::of(nodes, &out);
            let r = &out[p];
            let node = Load::least(&load.held, |n| !r.holds(n)).expect("enough nodes");
            out[p].standbys.push(node.to_string());
        }
    }

    // Even out what each node holds by moving standbys (never owners, which are even).
    while let Some((most, least)) = Load::uneven(&Load::of(nodes, &out).held) {
        let movable = out
            .iter_mut()
            .find(|r| r.owner != most && r.standbys.iter().any(|s| s == most) && !r.holds(least));
        let Some(r) = movable else {
            break;
        };
        for s in &mut r.standbys {
            if s == most {
                *s = least.to_string();
            }
        }
    }
    Assignment { partitions: out }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn nodes(ids: &[&str]) -> Vec<NodeId> {
        ids.iter().map(|s| s.to_string()).collect()
    }

    /// Every partition has an owner and the standbys asked for, all distinct and present;
    /// ownership differs by at most one between nodes.
    fn check(a: &Assignment, partitions: usize, nodes: &[NodeId], standbys: usize) {
        assert_eq!(a.partitions.len(), partitions);
        let standbys = standbys.min(nodes.len() - 1);
        for r in &a.partitions {
            let all: Vec<&NodeId> = std::iter::once(&r.owner).chain(&r.standbys).collect();
            assert_eq!(r.standbys.len(), standbys, "{r:?}");
            for (i, n) in all.iter().enumerate() {
                assert!(nodes.contains(n), "{n} is not a node: {r:?}");
                assert!(!all[..i].contains(n), "{n} twice: {r:?}");
            }
        }
        let load = Load::of(nodes, &a.partitions);
        let (lo, hi) = (
            load.owned.values().min().expect("a node"),
            load.owned.values().max().expect("a node"),
        );
        assert!(hi - lo <= 1, "owners uneven: {:?}", load.owned);
    }

    #[test]
    fn a_new_cluster_spreads_owners_and_standbys() {
        let three = nodes(&["a", "b", "c"]);
        let a = assign(None, 64, &three, 1);
        check(&a, 64, &three, 1);
        let load = Load::of(&three, &a.partitions);
        assert!(
            load.held.values().all(|&n| (42..=43).contains(&n)),
            "{:?}",
            load.held
        );
        // The same nodes again: nothing moves.
        assert_eq!(assign(Some(&a), 64, &three, 1), a);
    }

    #[test]
    fn an_owner_that_leaves_is_replaced_by_its_standby() {
        let three = nodes(&["a", "b", "c"]);
        let before = assign(None, 64, &three, 1);
        let two = nodes(&["a", "c"]);
        let after = assign(Some(&before), 64, &two, 1);
        check(&after, 64, &two, 1);
        for (b, a) in before.partitions.iter().zip(&after.partitions) {
            if b.owner == "b" {
                // Its standby was a caught-up copy: it takes over.
                assert_eq!(a.owner, b.standbys[0], "{b:?} -> {a:?}");
            }
        }
    }

    #[test]
    fn standbys_rank_the_same_everywhere_spread_and_stay_put() {
        let four = nodes(&["a", "b", "c", "d"]);
        let mut roles: BTreeMap<NodeId, usize> = BTreeMap::new();
        for p in 0..64 {
            let ranked = ranked_standbys(p, "a", &four, 2);
            assert_eq!(ranked.len(), 2);
            assert!(!ranked.contains(&"a".to_string()), "{ranked:?}");
            assert_ne!(ranked[0], ranked[1]);
            // Any node, given the nodes in any order, ranks them alike.
            let reversed: Vec<NodeId> = four.iter().rev().cloned().collect();
            assert_eq!(ranked_standbys(p, "a", &reversed, 2), ranked);
            *roles.entry(ranked[0].clone()).or_default() += 1;
            // A node leaving that was not a standby changes nothing.
            let other = four
                .iter()
                .find(|n| *n != "a" && !ranked.contains(n))
                .expect("a fourth node");
            let left: Vec<NodeId> = four.iter().filter(|n| *n != other).cloned().collect();
            assert_eq!(ranked_standbys(p, "a", &left, 2), ranked);
        }
        // The first standby's role spreads over b, c and d.
        assert!(roles.values().all(|&n| n >= 12), "{roles:?}");
        assert_eq!(
            ranked_standbys(0, "a", &nodes(&["a"]), 1),
            Vec::<NodeId>::new()
        );
    }

    proptest! {
        /// Any sequence of membership changes keeps the assignment valid, and a change moves
        /// ownership of few partitions: those of a node that left, plus what evening out
        /// needs (at most the new share of each node).
        #[test]
        fn membership_changes_keep_it_valid_and_move_little(
            partitions in 1usize..80,
            standbys in 0usize..3,
            steps in proptest::collection::vec(proptest::collection::btree_set(0u8..6, 1..6), 1..6),
        ) {
            let mut current: Option<Assignment> = None;
            for members in steps {
                let members: Vec<NodeId> = members.iter().map(|n| format!("n{n}")).collect();
                let next = assign(current.as_ref(), partitions, &members, standbys);
                check(&next, partitions, &members, standbys);
                if let Some(before) = &current {
                    // The members before: every node holding a replica then.
                    let mut old: Vec<&NodeId> = before
                        .partitions
                        .iter()
                        .flat_map(|r| std::iter::once(&r.owner).chain(&r.standbys))
                        .collect();
                    old.sort();
                    old.dedup();
                    let joined = members.iter().filter(|m| !old.contains(m)).count();
                    let left = old.iter().filter(|o| !members.contains(o)).count();
                    let moved = before.partitions.iter().zip(&next.partitions)
                        .filter(|(b, a)| members.contains(&b.owner) && b.owner != a.owner)
                        .count();
                    let share = partitions.div_ceil(members.len());
                    prop_assert!(
                        moved <= share * (joined + left),
                        "{moved} moved with {joined} joined and {left} left, share {share}"
                    );
                }
                prop_assert_eq!(&assign(Some(&next), partitions, &members, standbys), &next);
                current = Some(next);
            }
        }
    }
}
