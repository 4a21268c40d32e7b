//! Whose socket answers on a child's port: `/health` is open in `llama-server` and vLLM, so
//! a 200 there proves only that *something* listens. Before a child counts as ready, every
//! listening TCP socket on its port (IPv4 and IPv6, from `/proc/net/tcp{,6}`) must be held
//! by a process of the child's tree (its process group and its descendants, from
//! `/proc/<pid>/fd`). A process that bound the port first — vLLM binds only after loading,
//! minutes in — would otherwise be taken for the engine and be sent every prompt.

use std::collections::HashSet;
use std::fs;

/// Who listens on a port, as far as the socket tables and the child's descriptors tell.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Nobody (yet): the answer came from a socket that has closed since.
    Nobody,
    /// The socket tables cannot be read (no `/proc`): who listens cannot be told.
    Unknown,
    /// Every listening socket on the port is the child's.
    Child,
    /// At least one listening socket is not the child's: these are its holders (pid and
    /// command) where Hangar could see them.
    Stranger(Vec<(i32, String)>),
}

/// Who listens on `port`, for the child whose process group `leader` leads.
pub(crate) fn owner(leader: i32, port: u16) -> Owner {
    let mut listeners = Vec::new();
    let mut read = false;
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        if let Ok(text) = fs::read_to_string(table) {
            listeners.extend(listening(&text, port));
            read = true;
        }
    }
    if !read {
        return Owner::Unknown;
    }
    let tree = tree(leader, &processes());
    let held: HashSet<u64> = tree.iter().flat_map(|&pid| sockets(pid)).collect();
    match decide(&listeners, &held) {
        Decision::Nobody => Owner::Nobody,
        Decision::Child => Owner::Child,
        Decision::Stranger(inodes) => Owner::Stranger(holders(&inodes)),
    }
}

/// What the socket inodes say, before anyone is named.
#[derive(Debug, PartialEq, Eq)]
enum Decision {
    Nobody,
    Child,
    Stranger(Vec<u64>),
}

/// `listeners` (socket inodes listening on the port) against `held` (those the child's
/// tree holds): the child's only when there is at least one and every one is held.
fn decide(listeners: &[u64], held: &HashSet<u64>) -> Decision {
    let strangers: Vec<u64> = listeners.iter().copied().filter(|i| !held.contains(i)).collect();
    match (listeners.is_empty(), strangers.is_empty()) {
        (true, _) => Decision::Nobody,
        (false, true) => Decision::Child,
        (false, false) => Decision::Stranger(strangers),
    }
}

/// Inodes of the sockets in LISTEN state on local `port` in a `/proc/net/tcp{,6}` table.
fn listening(table: &str, port: u16) -> Vec<u64> {
    const LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let local = fields.get(1)?;
            let (_, hex_port) = local.rsplit_once(':')?;
            let listens = u16::from_str_radix(hex_port, 16).ok() == Some(port)
                && fields.get(3) == Some(&LISTEN);
            listens.then(|| fields.get(9)?.parse().ok()).flatten()
        })
        .filter(|&inode| inode != 0)
        .collect()
}

/// Every visible process as (pid, parent pid, process group).
fn processes() -> Vec<(i32, i32, i32)> {
    let Ok(dir) = fs::read_dir("/proc") else { return Vec::new() };
    dir.flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            let (ppid, pgrp) = parents(&stat)?;
            Some((pid, ppid, pgrp))
        })
        .collect()
}

/// Parent pid and process group from a `/proc/<pid>/stat` line (the command, in
/// parentheses, may hold spaces and parentheses: the fields start after the last `)`).
fn parents(stat: &str) -> Option<(i32, i32)> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(1);
    let ppid = fields.next()?.parse().ok()?;
    let pgrp = fields.next()?.parse().ok()?;
    Some((ppid, pgrp))
}

/// The child's tree in `processes`: the members of `leader`'s process group and every
/// descendant of one (an engine worker that made a group of its own stays in the tree).
fn tree(leader: i32, processes: &[(i32, i32, i32)]) -> HashSet<i32> {
    let mut tree: HashSet<i32> =
        processes.iter().filter(|&&(_, _, pgrp)| pgrp == leader).map(|&(pid, ..)| pid).collect();
    tree.insert(leader);
    loop {
        let before = tree.len();
        for &(pid, ppid, _) in processes {
            if tree.contains(&ppid) {
                tree.insert(pid);
            }
        }
        if tree.len() == before {
            return tree;
        }
    }
}

/// Inodes of the sockets `pid` holds open (none when its descriptors cannot be read).
fn sockets(pid: i32) -> Vec<u64> {
    let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else { return Vec::new() };
    fds.flatten()
        .filter_map(|fd| fs::read_link(fd.path()).ok())
        .filter_map(|target| {
            let target = target.to_str()?;
            target.strip_prefix("socket:[")?.strip_suffix(']')?.parse().ok()
        })
        .collect()
}

/// The processes Hangar can see holding one of `inodes`, with their command names.
fn holders(inodes: &[u64]) -> Vec<(i32, String)> {
    processes()
        .into_iter()
        .filter(|&(pid, ..)| sockets(pid).iter().any(|i| inodes.contains(i)))
        .map(|(pid, ..)| {
            let comm = fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
            (pid, comm.trim().to_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    const TABLE: &str = "\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 111 1 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 222 1 0
   2: 0100007F:1F90 0100007F:D431 01 00000000:00000000 00:00000000 00000000  1000        0 333 1 0
   3: 0100007F:1F91 00000000:0000 0A 00000000:00000000 00:00000000 00000000  1000        0 444 1 0
";

    #[test]
    fn only_listening_sockets_on_the_port_count() {
        // 8080 is 1F90: two listeners; the established connection (01) and port 8081 are not.
        assert_eq!(listening(TABLE, 8080), [111, 222]);
        assert_eq!(listening(TABLE, 8081), [444]);
        assert!(listening(TABLE, 9).is_empty());
        assert!(listening("garbage\nmore garbage", 8080).is_empty());
    }

    #[test]
    fn the_port_is_the_childs_only_when_it_holds_every_listener() {
        let held = |inodes: &[u64]| inodes.iter().copied().collect::<HashSet<u64>>();
        let cases: [(&[u64], &[u64], Decision); 5] = [
            (&[], &[1, 2], Decision::Nobody),
            (&[1], &[1, 2], Decision::Child),
            (&[1, 2], &[1, 2], Decision::Child),
            // A squatter on 127.0.0.1 beside the child's 0.0.0.0 gets the loopback traffic.
            (&[1, 3], &[1, 2], Decision::Stranger(vec![3])),
            (&[3], &[], Decision::Stranger(vec![3])),
        ];
        for (listeners, child, expected) in cases {
            assert_eq!(decide(listeners, &held(child)), expected, "{listeners:?} vs {child:?}");
        }
    }

    #[test]
    fn the_tree_is_the_group_and_its_descendants() {
        // (pid, ppid, pgrp): 10 leads; 11 is in its group; 12 made its own group under 11;
        // 13 descends from 12; 20 and 21 are someone else's.
        let procs =
            [(10, 1, 10), (11, 10, 10), (12, 11, 12), (13, 12, 12), (20, 1, 20), (21, 20, 10)];
        let tree = tree(10, &procs);
        let mut pids: Vec<i32> = tree.into_iter().collect();
        pids.sort_unstable();
        // 21 joined the group (a setpgid to 10): a group member is in the tree.
        assert_eq!(pids, [10, 11, 12, 13, 21]);
        assert_eq!(parents("5 (a) b) c) S 1 5 5 0"), Some((1, 5)));
    }

    #[test]
    fn a_socket_of_this_process_is_found_and_told_apart_from_a_strangers() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let me = std::process::id() as i32;
        let group = nix::unistd::getpgrp().as_raw();
        // This test process's group holds the socket: the "child" is its own group's leader.
        assert_eq!(owner(group, port), Owner::Child);
        // Seen from a tree that does not hold it (pid 1's, or nobody's), it is a stranger's,
        // and this process is named as its holder.
        match owner(i32::MAX, port) {
            Owner::Stranger(holders) => assert!(holders.iter().any(|(pid, _)| *pid == me)),
            other => panic!("{other:?}"),
        }
        drop(listener);
        assert_eq!(owner(group, port), Owner::Nobody);
    }
}
