//! Where a rank is and who its peers are: the rank and size from the launcher, a port of its own
//! on a NIC, and every rank's port learnt through a rendezvous directory the launcher names.
//!
//! The rank and size come from `NICBAR_ARMCI_RANK`/`NICBAR_ARMCI_SIZE` (this crate's launcher,
//! `nicbar-armci-run`), else Open MPI's `OMPI_COMM_WORLD_RANK`/`OMPI_COMM_WORLD_SIZE`, else
//! `PMI_RANK`/`PMI_SIZE`. Each rank opens the first free port (1 to 7, then 0) of unit
//! `NICBAR_ARMCI_UNIT` (default: its node-local rank modulo `NICBAR_ARMCI_UNITS`, default 1)
//! through the daemon of `NICBAR_SOCKET` (else the default socket), then writes its node and
//! port to `rank-<r>` in the rendezvous directory and reads everyone's. The directory is
//! `NICBAR_ARMCI_DIR`, else, under `mpirun`, one named after Open MPI's job id in
//! `$XDG_RUNTIME_DIR/nicbar` (else the system's temporary directory): ranks of one job on one
//! host find each other with no setting at all.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nicbar::{Error as PortError, NodeId, Port, PortId};

use crate::error::ArmciError;

/// The most ranks a job has (an exchange of one counter per rank fits one message).
pub const MAX_RANKS: usize = 256;

/// A rank's place in its job.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Placement {
    /// This rank.
    pub rank: usize,
    /// Ranks in the job.
    pub size: usize,
    /// The NIC unit to open a port on.
    pub unit: u8,
    /// The rendezvous directory.
    pub directory: PathBuf,
}

impl Placement {
    /// The placement the environment describes.
    ///
    /// # Errors
    /// [`ArmciError::Launch`] naming what is missing or malformed.
    pub fn from_env() -> Result<Self, ArmciError> {
        let var = |name: &str| std::env::var(name).ok();
        let number = |name: &str| -> Result<Option<usize>, ArmciError> {
            var(name)
                .map(|v| {
                    v.trim()
                        .parse()
                        .map_err(|_| ArmciError::Launch(format!("{name}={v:?} is not a number")))
                })
                .transpose()
        };
        let (rank, size) = match (
            number("NICBAR_ARMCI_RANK")?,
            number("NICBAR_ARMCI_SIZE")?,
            number("OMPI_COMM_WORLD_RANK")?,
            number("OMPI_COMM_WORLD_SIZE")?,
            number("PMI_RANK")?,
            number("PMI_SIZE")?,
        ) {
            (Some(rank), Some(size), ..) => (rank, size),
            (None, None, Some(rank), Some(size), ..) => (rank, size),
            (None, None, None, None, Some(rank), Some(size)) => (rank, size),
            _ => {
                return Err(ArmciError::Launch(
                    "no rank and size: start the program with nicbar-armci-run or mpirun \
                     (NICBAR_ARMCI_RANK and NICBAR_ARMCI_SIZE, or OMPI_COMM_WORLD_RANK and \
                     OMPI_COMM_WORLD_SIZE)"
                        .to_owned(),
                ));
            }
        };
        if size == 0 || size > MAX_RANKS || rank >= size {
            return Err(ArmciError::Launch(format!(
                "rank {rank} of {size} ranks: a job has 1 to {MAX_RANKS} ranks"
            )));
        }
        let local_rank = number("OMPI_COMM_WORLD_LOCAL_RANK")?.unwrap_or(rank);
        let units = number("NICBAR_ARMCI_UNITS")?.unwrap_or(1).max(1);
        let unit = number("NICBAR_ARMCI_UNIT")?.unwrap_or(local_rank % units);
        let unit = u8::try_from(unit)
            .map_err(|_| ArmciError::Launch(format!("unit {unit} is out of range")))?;
        let directory = match (var("NICBAR_ARMCI_DIR"), var("OMPI_MCA_ess_base_jobid")) {
            (Some(dir), _) => PathBuf::from(dir),
            (None, Some(job)) => std::env::var_os("XDG_RUNTIME_DIR")
                .map_or_else(std::env::temp_dir, PathBuf::from)
                .join("nicbar")
                .join(format!("armci-job-{job}")),
            (None, None) => {
                return Err(ArmciError::Launch(
                    "no rendezvous directory: set NICBAR_ARMCI_DIR to an empty directory all \
                     ranks see"
                        .to_owned(),
                ));
            }
        };
        Ok(Self {
            rank,
            size,
            unit,
            directory,
        })
    }
}

/// Opens the first free port of `unit` through `socket` (or the default socket).
///
/// # Errors
/// [`ArmciError::Port`] if no port is free or the daemon refuses.
pub fn open_free_port(socket: Option<&Path>, unit: u8) -> Result<Port, ArmciError> {
    let mut last = None;
    for port in [1, 2, 3, 4, 5, 6, 7, 0] {
        let opened = match socket {
            Some(socket) => Port::open_at(socket, unit, port),
            None => Port::open(unit, port),
        };
        match opened {
            Ok(port) => return Ok(port),
            Err(error @ PortError::PortBusy { .. }) => last = Some(error),
            Err(error) => return Err(ArmciError::Port(error)),
        }
    }
    Err(ArmciError::Port(
        last.unwrap_or(PortError::NoSuchUnit { unit, units: 0 }),
    ))
}

/// The file where `rank` writes its port.
fn rank_file(directory: &Path, rank: usize) -> PathBuf {
    directory.join(format!("rank-{rank}"))
}

/// Writes this rank's port to the rendezvous directory and reads every rank's, waiting at most
/// `timeout` for them all.
///
/// # Errors
/// [`ArmciError::Launch`] if the directory cannot be written, a file is malformed, or a rank
/// did not write its file in time.
pub fn rendezvous(
    placement: &Placement,
    me: (NodeId, PortId),
    timeout: Duration,
) -> Result<Vec<(NodeId, PortId)>, ArmciError> {
    let dir = &placement.directory;
    let io = |what: &str, path: &Path, e: std::io::Error| {
        ArmciError::Launch(format!("cannot {what} {}: {e}", path.display()))
    };
    std::fs::create_dir_all(dir).map_err(|e| io("create", dir, e))?;
    let file = rank_file(dir, placement.rank);
    let temporary = dir.join(format!(".rank-{}.{}", placement.rank, std::process::id()));
    std::fs::write(&temporary, format!("{} {}\n", me.0.get(), me.1.0))
        .map_err(|e| io("write", &temporary, e))?;
    // Renamed into place whole, so a reader never sees half a line.
    std::fs::rename(&temporary, &file).map_err(|e| io("write", &file, e))?;
    let deadline = Instant::now() + timeout;
    let mut peers = Vec::with_capacity(placement.size);
    for rank in 0..placement.size {
        let path = rank_file(dir, rank);
        let text = loop {
            match std::fs::read_to_string(&path) {
                Ok(text) => break text,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    if Instant::now() >= deadline {
                        return Err(ArmciError::Launch(format!(
                            "rank {rank} did not write {} within {timeout:?}",
                            path.display()
                        )));
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(e) => return Err(io("read", &path, e)),
            }
        };
        peers.push(parse_rank_file(&text).ok_or_else(|| {
            ArmciError::Launch(format!(
                "{} holds {text:?}, not `node port`",
                path.display()
            ))
        })?);
    }
    Ok(peers)
}

/// Removes this rank's rendezvous file (at the end of the job, once every rank has read it), and
/// the directory if it is then empty (the last rank to leave removes it).
pub fn leave(placement: &Placement) {
    let _ = std::fs::remove_file(rank_file(&placement.directory, placement.rank));
    let _ = std::fs::remove_dir(&placement.directory);
}

fn parse_rank_file(text: &str) -> Option<(NodeId, PortId)> {
    let mut words = text.split_whitespace();
    let node: u16 = words.next()?.parse().ok()?;
    let port: u8 = words.next()?.parse().ok()?;
    if words.next().is_some() {
        return None;
    }
    PortId(port).index()?;
    Some((NodeId::new(node), PortId(port)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_files_parse_strictly() {
        assert_eq!(parse_rank_file("3 5\n"), Some((NodeId::new(3), PortId(5))));
        assert_eq!(parse_rank_file("3"), None);
        assert_eq!(parse_rank_file("3 5 7"), None);
        assert_eq!(parse_rank_file("3 9"), None, "a port out of range");
        assert_eq!(parse_rank_file("x 1"), None);
    }
}
