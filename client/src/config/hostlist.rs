//! Slurm's host lists (`node[01-04,07],gpu-a[1-2]`), expanded: how a job
//! under Slurm names its peers without a list written by hand for each
//! allocation (`peers = ["slurm:7070"]`, from `SLURM_JOB_NODELIST`).

/// Hosts a list may expand to: a hostile or mistyped range
/// (`n[0-999999999]`) is an error, never a huge allocation.
pub(crate) const MAX_HOSTS: usize = 1 << 16;

/// The hosts of a Slurm host list, in its order: items separated by commas
/// outside brackets; each a name with bracketed groups of numbers and
/// ranges (`01-04` keeps the width of its first bound), several groups
/// multiplying out (`rack[1-2]-n[1-3]`).
pub(crate) fn expand(list: &str, max: usize) -> Result<Vec<String>, String> {
    let mut out: Vec<String> = Vec::new();
    for item in split_top(list)? {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let mut names = vec![String::new()];
        let mut rest = item;
        while !rest.is_empty() {
            let Some(open) = rest.find('[') else {
                names.iter_mut().for_each(|n| n.push_str(rest));
                break;
            };
            if lo_width_too_wide(&rest[open..]) {
                return Err(format!("{item:?}: a number wider than {MAX_WIDTH} digits"));
            }
            let close = rest[open..]
                .find(']')
                .map(|c| c + open)
                .ok_or_else(|| format!("{item:?}: a '[' without its ']'"))?;
            let (lit, group) = (&rest[..open], &rest[open + 1..close]);
            let values = numbers(group, max).map_err(|e| format!("{item:?}: {e}"))?;
            if names
                .len()
                .saturating_mul(values.len())
                .saturating_add(out.len())
                > max
            {
                return Err(format!("{list:?} names more than {max} hosts"));
            }
            names = names
                .iter()
                .flat_map(|n| values.iter().map(move |v| format!("{n}{lit}{v}")))
                .collect();
            rest = &rest[close + 1..];
        }
        out.extend(names);
        if out.len() > max {
            return Err(format!("{list:?} names more than {max} hosts"));
        }
    }
    if out.is_empty() {
        return Err(format!("{list:?} names no host"));
    }
    Ok(out)
}

/// Widest number a group may write (Slurm's own limit is far below).
const MAX_WIDTH: usize = 20;

/// Whether a bracketed group (from its '[') holds a number wider than
/// [`MAX_WIDTH`]: its padding would multiply into every host's name.
fn lo_width_too_wide(group: &str) -> bool {
    let inner = group.split(']').next().unwrap_or_default();
    inner.split([',', '-']).any(|n| n.trim().len() > MAX_WIDTH)
}

/// The items of a list: split at commas outside brackets.
fn split_top(list: &str) -> Result<Vec<&str>, String> {
    let (mut depth, mut start, mut items) = (0u32, 0, Vec::new());
    for (i, c) in list.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(format!("{list:?}: brackets inside brackets")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(format!("{list:?}: a ']' without its '['")),
            ',' if depth == 0 => {
                items.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{list:?}: a '[' without its ']'"));
    }
    items.push(&list[start..]);
    Ok(items)
}

/// The values of one bracketed group (`01-04,07`), zero-padded as written.
fn numbers(group: &str, max: usize) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    for part in group.split(',').map(str::trim) {
        let (lo, hi) = part.split_once('-').unwrap_or((part, part));
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(format!("[{group}]: {part:?} is not a number or a range"));
        }
        let (a, b): (u64, u64) = (
            lo.parse()
                .map_err(|_| format!("[{group}]: {lo:?} is too large"))?,
            hi.parse()
                .map_err(|_| format!("[{group}]: {hi:?} is too large"))?,
        );
        if b < a {
            return Err(format!("[{group}]: the range {part:?} runs backwards"));
        }
        if b - a >= (max - out.len().min(max)) as u64 {
            return Err(format!("[{group}] names more than {max} hosts"));
        }
        let width = lo.len();
        out.extend((a..=b).map(|v| format!("{v:0width$}")));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hosts(list: &str) -> Vec<String> {
        expand(list, MAX_HOSTS).unwrap_or_else(|e| panic!("{list}: {e}"))
    }

    #[test]
    fn slurm_host_lists_expand_in_order_with_their_padding() {
        assert_eq!(
            hosts("node[01-03,07],gpu-a[1-2]"),
            ["node01", "node02", "node03", "node07", "gpu-a1", "gpu-a2"]
        );
        assert_eq!(
            hosts("rack[1-2]-n[8-9]"),
            ["rack1-n8", "rack1-n9", "rack2-n8", "rack2-n9"]
        );
        assert_eq!(hosts("login"), ["login"]);
        assert_eq!(hosts("a,b"), ["a", "b"]);
        assert_eq!(
            hosts("n[098-101]-ib"),
            ["n098-ib", "n099-ib", "n100-ib", "n101-ib"]
        );
        assert_eq!(hosts("n[5]"), ["n5"]);
    }

    #[test]
    fn malformed_or_huge_lists_are_errors() {
        for bad in [
            "n[1-",
            "n1-3]",
            "n[[1-2]]",
            "n[3-1]",
            "n[a-b]",
            "n[1-2",
            "n[]",
            "",
            ",",
            "n[0-99999999999999999999]",
        ] {
            assert!(expand(bad, MAX_HOSTS).is_err(), "{bad:?}");
        }
        let e = expand("n[0-999999999]", MAX_HOSTS).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        let e = expand("a[0-300]-b[0-300]", MAX_HOSTS).unwrap_err();
        assert!(e.contains("more than"), "{e}");
        assert_eq!(expand("n[1-4]", 4).map(|h| h.len()), Ok(4));
        assert!(expand("n[1-5]", 4).is_err());
        assert!(expand("a,b,c", 2).is_err(), "plain names count too");
        let wide = format!("n[{}1-2]", "0".repeat(30));
        assert!(expand(&wide, MAX_HOSTS).is_err());
    }
}
