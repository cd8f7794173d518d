//! Resident memory from `/proc/<pid>/status`: `VmHWM` is the kernel's own peak,
//! so sampling it once after the work is enough to see the worst moment.

/// Memory of one process, in KiB as the kernel reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Memory {
    /// Highest resident set size so far (VmHWM, KiB).
    pub peak_kib: u64,
    /// Resident set size now (VmRSS, KiB).
    pub current_kib: u64,
}

impl Memory {
    /// `peak_kib` in MiB.
    pub fn peak_mib(&self) -> f64 {
        self.peak_kib as f64 / 1024.0
    }
}

/// `None` for the current process; `None` back when the process is gone or the
/// platform has no `/proc`.
pub fn read_memory(pid: Option<u32>) -> Option<Memory> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    parse_status(&std::fs::read_to_string(path).ok()?)
}

fn parse_status(status: &str) -> Option<Memory> {
    let field = |name: &str| {
        status
            .lines()
            .find_map(|line| line.strip_prefix(name))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
    };
    Some(Memory {
        peak_kib: field("VmHWM:")?,
        current_kib: field("VmRSS:")?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_peak_and_current_from_a_status_file() {
        let status = "Name:\tpayment-worker\nVmPeak:\t  900000 kB\nVmHWM:\t   81920 kB\nVmRSS:\t   40960 kB\n";
        let memory = parse_status(status).unwrap();
        assert_eq!(
            memory,
            Memory {
                peak_kib: 81920,
                current_kib: 40960
            }
        );
        assert_eq!(memory.peak_mib(), 80.0);
    }

    #[test]
    fn this_process_has_a_peak_at_least_its_current_size() {
        let memory = read_memory(None).expect("/proc/self/status on Linux");
        assert!(memory.peak_kib >= memory.current_kib);
        assert!(memory.current_kib > 0);
    }

    #[test]
    fn a_status_without_the_fields_is_none() {
        assert_eq!(parse_status("Name:\tx\n"), None);
    }
}
