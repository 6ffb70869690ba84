//! Where this process sits in a run of several processes, read from the variables the
//! launchers set: torchrun's (`RANK`, `WORLD_SIZE`, `LOCAL_RANK`, `MASTER_ADDR`,
//! `MASTER_PORT`) or srun's (`SLURM_PROCID`, `SLURM_STEP_NUM_TASKS`, `SLURM_LOCALID`, the first
//! node of `SLURM_STEP_NODELIST`).

use crate::error::{Error, Result};

/// The port rank 0 listens on when a Slurm job gives none (`MASTER_PORT` unset): a fixed base
/// plus the job id, so that every task of the job computes the same one.
const SLURM_PORT_BASE: u16 = 29_500;

/// This process among the processes of one run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Global rank of this process; rank 0 hosts the rendezvous and writes the outputs.
    pub rank: usize,
    /// Processes in the run.
    pub world: usize,
    /// Rank among the processes of this machine.
    pub local_rank: usize,
    /// The host of rank 0, as the other processes reach it.
    pub master: String,
    /// The rendezvous port on `master`; xtoken-collective's orchestrator takes the next one.
    pub port: u16,
    /// Which launcher's variables these are (`torchrun` or `srun`), for messages.
    pub launcher: &'static str,
}

impl Placement {
    /// The placement the environment gives, or `None` for a process launched alone.
    pub fn from_env() -> Result<Option<Self>> {
        Self::from_vars(|name| std::env::var(name).ok())
    }

    /// The placement the variables `var` returns describe (torchrun's first, then srun's), or
    /// `None` when neither launcher started this process. A Slurm batch script sets
    /// `SLURM_NTASKS` without starting any task: only a job step (srun) counts.
    pub fn from_vars(var: impl Fn(&str) -> Option<String>) -> Result<Option<Self>> {
        if var("WORLD_SIZE").is_some() {
            return torchrun(&var).map(Some);
        }
        if var("SLURM_STEP_NUM_TASKS").is_some() {
            return srun(&var).map(Some);
        }
        // A rank without a world: a launch environment half set, whose process would otherwise
        // train alone while its peers wait.
        let partial = ["RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"]
            .into_iter()
            .filter(|name| var(name).is_some())
            .collect::<Vec<_>>();
        if !partial.is_empty() {
            return Err(Error::Config(format!(
                "{} set but WORLD_SIZE is not: a partial launch environment (torchrun sets all \
                 of RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT); set WORLD_SIZE, or unset \
                 them to train in one process",
                partial.join(", ")
            )));
        }
        Ok(None)
    }
}

fn torchrun(var: &impl Fn(&str) -> Option<String>) -> Result<Placement> {
    let world = number(var, "WORLD_SIZE")?;
    Placement {
        rank: number(var, "RANK")?,
        world,
        local_rank: optional_number(var, "LOCAL_RANK")?.unwrap_or(0),
        master: required(var, "MASTER_ADDR")?,
        port: port(var, "MASTER_PORT")?,
        launcher: "torchrun",
    }
    .checked()
}

fn srun(var: &impl Fn(&str) -> Option<String>) -> Result<Placement> {
    let master = match var("MASTER_ADDR") {
        Some(host) => host,
        None => {
            let list = var("SLURM_STEP_NODELIST")
                .or_else(|| var("SLURM_JOB_NODELIST"))
                .ok_or_else(|| missing("SLURM_STEP_NODELIST"))?;
            first_host(&list).ok_or_else(|| {
                Error::Config(format!("SLURM_STEP_NODELIST = {list:?}: no host in it"))
            })?
        }
    };
    let port = match var("MASTER_PORT") {
        Some(_) => port(var, "MASTER_PORT")?,
        None => {
            let job = optional_number(var, "SLURM_JOB_ID")?.unwrap_or(0);
            SLURM_PORT_BASE + (job % 20_000) as u16
        }
    };
    Placement {
        rank: number(var, "SLURM_PROCID")?,
        world: number(var, "SLURM_STEP_NUM_TASKS")?,
        local_rank: optional_number(var, "SLURM_LOCALID")?.unwrap_or(0),
        master,
        port,
        launcher: "srun",
    }
    .checked()
}

impl Placement {
    fn checked(self) -> Result<Self> {
        if self.world == 0 || self.rank >= self.world {
            return Err(Error::Config(format!(
                "{}: rank {} of a world of {} processes: the rank must be below the world size",
                self.launcher, self.rank, self.world
            )));
        }
        if self.port == u16::MAX {
            return Err(Error::Config(format!(
                "{}: port {} leaves no port after it for xtoken-collective's orchestrator",
                self.launcher, self.port
            )));
        }
        Ok(self)
    }
}

/// The first host of a Slurm host list: `gpu-[07-09,12],login1` → `gpu-07`.
pub fn first_host(list: &str) -> Option<String> {
    let list = list.trim();
    let first = match (list.find(','), list.find('[')) {
        (Some(comma), Some(open)) if comma < open => &list[..comma],
        (Some(comma), None) => &list[..comma],
        _ => list,
    };
    let Some(open) = first.find('[') else {
        return (!first.is_empty()).then(|| first.to_string());
    };
    let close = open + first[open..].find(']')?;
    let ranges = &first[open + 1..close];
    let start = ranges.split([',', '-']).next()?.trim();
    let suffix = first[close + 1..].split(',').next().unwrap_or("");
    (!start.is_empty()).then(|| format!("{}{start}{suffix}", &first[..open]))
}

fn missing(name: &str) -> Error {
    Error::Config(format!(
        "{name} is not set: a process of a multi-process run needs it (see the book, \"Several \
         GPUs, processes and machines\")"
    ))
}

fn required(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<String> {
    var(name)
        .filter(|v| !v.trim().is_empty())
        .ok_or_else(|| missing(name))
}

fn optional_number(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<Option<usize>> {
    var(name)
        .map(|v| {
            v.trim().parse::<usize>().map_err(|_| {
                Error::Config(format!("{name} = {v:?}: not a non-negative whole number"))
            })
        })
        .transpose()
}

fn number(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<usize> {
    optional_number(var, name)?.ok_or_else(|| missing(name))
}

fn port(var: &impl Fn(&str) -> Option<String>, name: &str) -> Result<u16> {
    let value = number(var, name)?;
    u16::try_from(value)
        .ok()
        .filter(|&p| p > 0)
        .ok_or_else(|| Error::Config(format!("{name} = {value}: not a TCP port (1–65535)")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn place(vars: &[(&str, &str)]) -> Result<Option<Placement>> {
        let vars: HashMap<String, String> = vars
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Placement::from_vars(|name| vars.get(name).cloned())
    }

    #[test]
    fn torchrun_variables_place_the_process() {
        let p = place(&[
            ("RANK", "3"),
            ("WORLD_SIZE", "8"),
            ("LOCAL_RANK", "1"),
            ("MASTER_ADDR", "10.0.0.1"),
            ("MASTER_PORT", "29400"),
            ("SLURM_STEP_NUM_TASKS", "2"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.rank, p.world, p.local_rank), (3, 8, 1));
        assert_eq!(
            (p.master.as_str(), p.port, p.launcher),
            ("10.0.0.1", 29400, "torchrun")
        );
    }

    #[test]
    fn srun_variables_place_the_process_on_the_first_node() {
        let p = place(&[
            ("SLURM_PROCID", "5"),
            ("SLURM_STEP_NUM_TASKS", "16"),
            ("SLURM_LOCALID", "1"),
            ("SLURM_STEP_NODELIST", "gpu-[07-09,12],login1"),
            ("SLURM_JOB_ID", "123456"),
            ("SLURM_NTASKS", "16"),
        ])
        .unwrap()
        .unwrap();
        assert_eq!((p.rank, p.world, p.local_rank), (5, 16, 1));
        assert_eq!(p.master, "gpu-07");
        assert_eq!(p.port, SLURM_PORT_BASE + (123456 % 20_000) as u16);
    }

    #[test]
    fn a_batch_script_without_srun_is_a_process_alone() {
        let vars = [
            ("SLURM_NTASKS", "4"),
            ("SLURM_PROCID", "0"),
            ("SLURM_JOB_ID", "7"),
        ];
        assert_eq!(place(&vars).unwrap(), None);
        assert_eq!(place(&[]).unwrap(), None);
    }

    #[test]
    fn bad_or_missing_variables_are_named() {
        let err = |vars: &[(&str, &str)]| place(vars).unwrap_err().to_string();
        let base = [
            ("WORLD_SIZE", "2"),
            ("MASTER_ADDR", "h"),
            ("MASTER_PORT", "1"),
        ];
        assert!(err(&base).contains("RANK is not set"));
        let rank = [&base[..], &[("RANK", "2")]].concat();
        assert!(err(&rank).contains("rank 2 of a world of 2"));
        let port = [("RANK", "0"), ("WORLD_SIZE", "2"), ("MASTER_ADDR", "h")];
        let port = [&port[..], &[("MASTER_PORT", "70000")]].concat();
        assert!(err(&port).contains("MASTER_PORT = 70000"));
        assert!(err(&[("RANK", "1")]).contains("RANK set but WORLD_SIZE is not"));
        let word = [("RANK", "x"), ("WORLD_SIZE", "2")];
        assert!(err(&word).contains("RANK = \"x\""));
    }

    #[test]
    fn host_lists_give_their_first_host() {
        assert_eq!(first_host("node1").as_deref(), Some("node1"));
        assert_eq!(first_host("a,b").as_deref(), Some("a"));
        assert_eq!(first_host("gpu[003-004]").as_deref(), Some("gpu003"));
        assert_eq!(first_host("n[5,7]-ib,x").as_deref(), Some("n5-ib"));
        assert_eq!(first_host("login,gpu[1-2]").as_deref(), Some("login"));
        assert_eq!(first_host(""), None);
    }
}
