//! The hashing threads a rank uses when `hash_threads` is left at 0
//! (automatic): its share of the node's cores. Eight ranks on a node each
//! taking every core would run eight times as many hashing threads as
//! there are cores, against the dataloader.

use std::path::Path;

/// The cores one rank hashes on: the cores this process may use, divided
/// among the node's `local_world_size` ranks, unless the launcher bound
/// each rank to its own CPUs already (Slurm's `--cpu-bind=cores`): a
/// binding no larger than one rank's share of the online CPUs is that
/// share. A binding several ranks share (a container's cpuset, a NUMA
/// node per group of ranks) is divided like the whole machine.
pub(crate) fn auto_hash_threads(local_world_size: Option<u32>) -> usize {
    let usable = std::thread::available_parallelism().map_or(1, |n| n.get());
    let ranks = local_world_size.unwrap_or(1).max(1) as usize;
    let bound = match (
        read_list(Path::new("/proc/self/status"), "Cpus_allowed_list:"),
        read_list(Path::new("/sys/devices/system/cpu/online"), ""),
    ) {
        (Some(allowed), Some(online)) => allowed.saturating_mul(ranks) <= online && ranks > 1,
        _ => false,
    };
    share(usable, bound, local_world_size)
}

/// `usable` cores split among the node's ranks (at least one each), or
/// all of them where the process is `bound` already.
pub(crate) fn share(usable: usize, bound: bool, local_world_size: Option<u32>) -> usize {
    match local_world_size {
        Some(n) if n > 1 && !bound => (usable / n as usize).max(1),
        _ => usable.max(1),
    }
}

/// The CPU count of a list like `0-3,8-11` on the line of `file` that
/// starts with `prefix` (the whole file where the prefix is empty).
fn read_list(file: &Path, prefix: &str) -> Option<usize> {
    let text = std::fs::read_to_string(file).ok()?;
    let line = text.lines().find(|l| l.starts_with(prefix))?;
    count_cpus(line[prefix.len()..].trim())
}

/// CPUs in a kernel CPU list (`0-3,8-11`, `5`); None if malformed.
pub(crate) fn count_cpus(list: &str) -> Option<usize> {
    let mut n = 0usize;
    for part in list.split(',').filter(|p| !p.is_empty()) {
        let more = match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                b.checked_sub(a)?.checked_add(1)?
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                1
            }
        };
        n = n.checked_add(more)?;
    }
    (n > 0).then_some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn eight_ranks_on_sixty_four_cores_hash_on_eight_each() {
        assert_eq!(share(64, false, Some(8)), 8);
        assert_eq!(share(64, false, None), 64, "ranks per node unknown");
        assert_eq!(share(64, false, Some(1)), 64);
        assert_eq!(share(4, false, Some(8)), 1, "at least one");
        assert_eq!(share(8, true, Some(8)), 8, "bound by the launcher already");
    }

    #[test]
    fn kernel_cpu_lists_are_counted() {
        assert_eq!(count_cpus("0-3,8-11"), Some(8));
        assert_eq!(count_cpus("5"), Some(1));
        assert_eq!(count_cpus("0-63"), Some(64));
        assert_eq!(count_cpus("3-1"), None);
        assert_eq!(count_cpus("x"), None);
        assert_eq!(count_cpus(""), None);
        assert_eq!(count_cpus("0-18446744073709551615"), None, "no overflow");
        assert!(auto_hash_threads(None) >= 1);
    }
}
