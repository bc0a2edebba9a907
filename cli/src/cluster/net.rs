//! The network of a test-bed cluster: each node in a Linux network
//! namespace of its own, joined by veth pairs to a bridge in the host's
//! namespace (which holds the bridge's address, where etcd and the object
//! store listen); a node's link can be cut (veth down) and restored. Where
//! namespaces cannot be made (not root, no `ip`), every node gets its own
//! loopback address instead and the fabric says so; links cannot be cut
//! there.

use std::net::Ipv4Addr;
use std::process::Command;

/// How the nodes are separated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Isolation {
    /// Network namespaces joined by a bridge.
    Namespaces,
    /// Loopback addresses in one namespace, and why namespaces were not
    /// used.
    Loopback(String),
}

/// The nodes' network.
#[derive(Debug)]
pub struct Fabric {
    /// How nodes are separated.
    pub isolation: Isolation,
    tag: String,
    subnet: [u8; 3],
    nodes: usize,
}

fn ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

impl Fabric {
    /// A network for `nodes` nodes: namespaces when possible (and not
    /// `force_loopback`), else loopback addresses.
    pub fn new(nodes: usize, force_loopback: bool) -> Fabric {
        // Unique per fabric: tests on threads of one process share a pid.
        static SEQ: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = std::process::id().wrapping_mul(7).wrapping_add(n);
        let tag = format!("{:x}", id % 0xfffff);
        let subnet = [10, 200 + (id % 50) as u8, ((id / 50) % 250) as u8];
        let mut f = Fabric {
            isolation: Isolation::Loopback(String::new()),
            tag,
            subnet,
            nodes,
        };
        if force_loopback {
            f.isolation = Isolation::Loopback("asked for".into());
            return f;
        }
        match f.build() {
            Ok(()) => f.isolation = Isolation::Namespaces,
            Err(e) => {
                f.teardown();
                f.isolation = Isolation::Loopback(e);
            }
        }
        f
    }

    fn bridge(&self) -> String {
        format!("sb{}", self.tag)
    }

    /// The namespace of node `i`.
    pub fn namespace(&self, i: usize) -> String {
        format!("sn{}-{i}", self.tag)
    }

    fn veth(&self, i: usize) -> (String, String) {
        (format!("sv{}h{i}", self.tag), format!("sv{}n{i}", self.tag))
    }

    fn build(&self) -> Result<(), String> {
        let [a, b, c] = self.subnet;
        let br = self.bridge();
        ip(&["link", "add", "name", &br, "type", "bridge"])?;
        ip(&["addr", "add", &format!("{a}.{b}.{c}.254/24"), "dev", &br])?;
        ip(&["link", "set", &br, "up"])?;
        for i in 0..self.nodes {
            let ns = self.namespace(i);
            let (host, node) = self.veth(i);
            ip(&["netns", "add", &ns])?;
            ip(&["link", "add", &host, "type", "veth", "peer", "name", &node])?;
            ip(&["link", "set", &node, "netns", &ns])?;
            ip(&["link", "set", &host, "master", &br])?;
            ip(&["link", "set", &host, "up"])?;
            let addr = format!("{a}.{b}.{c}.{}/24", i + 1);
            ip(&[
                "netns", "exec", &ns, "ip", "addr", "add", &addr, "dev", &node,
            ])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", &node, "up"])?;
            ip(&["netns", "exec", &ns, "ip", "link", "set", "lo", "up"])?;
        }
        Ok(())
    }

    fn teardown(&self) {
        for i in 0..self.nodes {
            let _ = ip(&["link", "del", &self.veth(i).0]);
            let _ = ip(&["netns", "del", &self.namespace(i)]);
        }
        let _ = ip(&["link", "del", &self.bridge()]);
    }

    /// Node `i`'s address.
    pub fn addr(&self, i: usize) -> Ipv4Addr {
        match self.isolation {
            Isolation::Namespaces => {
                let [a, b, c] = self.subnet;
                Ipv4Addr::new(a, b, c, (i + 1) as u8)
            }
            Isolation::Loopback(_) => {
                Ipv4Addr::new(127, self.subnet[1], self.subnet[2], (i + 1) as u8)
            }
        }
    }

    /// The address shared services (etcd, the object store) listen on,
    /// reachable from every node.
    pub fn services_addr(&self) -> Ipv4Addr {
        match self.isolation {
            Isolation::Namespaces => {
                let [a, b, c] = self.subnet;
                Ipv4Addr::new(a, b, c, 254)
            }
            Isolation::Loopback(_) => Ipv4Addr::new(127, self.subnet[1], self.subnet[2], 254),
        }
    }

    /// A command that runs `program` on node `i` (in its namespace).
    pub fn command(&self, i: usize, program: &std::path::Path) -> Command {
        match self.isolation {
            Isolation::Namespaces => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", &self.namespace(i)]).arg(program);
                c
            }
            Isolation::Loopback(_) => Command::new(program),
        }
    }

    /// Cuts (`up` false) or restores node `i`'s link. Only with
    /// namespaces. A restored link forgets the neighbours the node could
    /// not reach while it was cut: an address resolution still failing
    /// from then would fail the node's next connection ("no route to
    /// host") though the link is back.
    pub fn link(&self, i: usize, up: bool) -> Result<(), String> {
        if self.isolation != Isolation::Namespaces {
            return Err("links can only be cut between network namespaces".into());
        }
        ip(&[
            "link",
            "set",
            &self.veth(i).0,
            if up { "up" } else { "down" },
        ])?;
        if up {
            let (ns, dev) = (self.namespace(i), self.veth(i).1);
            ip(&["netns", "exec", &ns, "ip", "neigh", "flush", "dev", &dev])?;
        }
        Ok(())
    }
}

impl Fabric {
    /// Delays node `i`'s outgoing packets by `delay` (`tc netem`; zero
    /// removes it). Only with namespaces, and only where the kernel has
    /// netem (`sch_netem`): elsewhere an error that says so.
    pub fn delay(&self, i: usize, delay: std::time::Duration) -> Result<(), String> {
        if self.isolation != Isolation::Namespaces {
            return Err("delays need network namespaces".into());
        }
        let ns = self.namespace(i);
        let dev = self.veth(i).1;
        let mut args = vec!["netns", "exec", &ns, "tc", "qdisc"];
        let ms = format!("{}ms", delay.as_millis());
        if delay.is_zero() {
            args.extend(["del", "dev", &dev, "root"]);
        } else {
            args.extend(["replace", "dev", &dev, "root", "netem", "delay", &ms]);
        }
        let out = Command::new("ip")
            .args(&args)
            .output()
            .map_err(|e| format!("tc: {e} (is iproute2's tc installed?)"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "tc netem on {}: {} (this kernel may lack sch_netem)",
                self.namespace(i),
                String::from_utf8_lossy(&out.stderr).trim()
            ))
        }
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if self.isolation == Isolation::Namespaces {
            self.teardown();
        }
    }
}
