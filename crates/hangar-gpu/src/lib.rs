//! Hangar's GPU telemetry.
//!
//! This crate owns how Hangar reads GPU memory, and nothing about models:
//!
//! - [`GpuProbe`]: one call, [`GpuProbe::read`], that answers every GPU's name, used and
//!   total memory and the memory each process uses on it ([`GpuReading`]), or why it cannot
//!   ([`Unavailable`]: no driver, no library, an NVML error) — never a panic;
//! - [`NvmlProbe`]: the implementation on NVIDIA's NVML through `nvml-wrapper`, initialised
//!   once by the host ([`probe`]);
//! - [`process_tree`] and [`tree_memory`]: the GPU memory a child engine and its
//!   descendants hold, from the per-process readings, in all and per GPU; [`used_growth`]:
//!   what a load took on each GPU, from readings before and after it;
//! - [`fake`]: the fake NVML library Hangar's tests build and load instead of the driver's;
//! - [`NoGpu`]: a probe that is always unavailable, with its reason, and [`ScriptedProbe`],
//!   whose readings tests set.

pub mod fake;
mod nvml;
mod process;

use std::sync::{Arc, Mutex, PoisonError};

pub use crate::nvml::NvmlProbe;
pub use crate::process::{TreeMemory, process_tree, tree_memory, used_growth};

/// Bytes in a MiB.
pub const MIB: u64 = 1024 * 1024;

/// One GPU's memory, as the probe read it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct GpuReading {
    /// The GPU's index (NVML's, as `nvidia-smi` shows it).
    pub index: u32,
    /// Its product name.
    pub name: String,
    /// Memory in use, in MiB.
    pub used_mib: u64,
    /// Memory in all, in MiB.
    pub total_mib: u64,
    /// Processes with memory on this GPU.
    pub processes: Vec<GpuProcess>,
}

impl GpuReading {
    /// `"<used>MiB / <total>MiB"`, `nvidia-smi`'s compact form.
    pub fn used_over_total(&self) -> String {
        format!("{}MiB / {}MiB", self.used_mib, self.total_mib)
    }
}

/// A process's memory on one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct GpuProcess {
    /// Its process id.
    pub pid: u32,
    /// Memory it uses on the GPU, in MiB; `None` when the driver does not say (some
    /// virtualised setups).
    pub used_mib: Option<u64>,
}

/// Why the probe has no readings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("GPU telemetry is unavailable: {reason}")]
pub struct Unavailable {
    /// The library's or the driver's reason.
    pub reason: String,
}

/// Reads GPU memory. Implementations are cheap to share and never panic.
pub trait GpuProbe: Send + Sync + 'static {
    /// Every GPU's memory now, in index order.
    ///
    /// # Errors
    /// [`Unavailable`] with the reason when there is nothing to read (no driver, no library)
    /// or the read failed.
    fn read(&self) -> Result<Vec<GpuReading>, Unavailable>;
}

/// A probe that has nothing to read, and says why.
#[derive(Debug, Clone)]
pub struct NoGpu(pub String);

impl GpuProbe for NoGpu {
    fn read(&self) -> Result<Vec<GpuReading>, Unavailable> {
        Err(Unavailable { reason: self.0.clone() })
    }
}

/// A probe whose readings the test sets ([`ScriptedProbe::set`]).
#[derive(Debug, Default)]
pub struct ScriptedProbe(Mutex<Option<Result<Vec<GpuReading>, Unavailable>>>);

impl ScriptedProbe {
    /// A probe with these readings.
    pub fn new(readings: Vec<GpuReading>) -> Self {
        Self(Mutex::new(Some(Ok(readings))))
    }

    /// What the next reads answer.
    pub fn set(&self, readings: Result<Vec<GpuReading>, Unavailable>) {
        *self.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(readings);
    }
}

impl GpuProbe for ScriptedProbe {
    fn read(&self) -> Result<Vec<GpuReading>, Unavailable> {
        let readings = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone();
        readings.unwrap_or_else(|| Err(Unavailable { reason: "no readings scripted".into() }))
    }
}

/// The environment variable naming the NVML library to load instead of the driver's
/// `libnvidia-ml.so.1` (a fake one in tests, a driver outside the loader's path).
pub const NVML_LIBRARY_ENV: &str = "HANGAR_NVML_LIBRARY";

/// The host's probe: NVML (the library [`NVML_LIBRARY_ENV`] names, else the driver's),
/// initialised once, or [`NoGpu`] with NVML's reason when it cannot start.
pub fn probe() -> Arc<dyn GpuProbe> {
    let library = std::env::var_os(NVML_LIBRARY_ENV);
    match NvmlProbe::init(library.as_deref()) {
        Ok(nvml) => Arc::new(nvml),
        Err(e) => Arc::new(NoGpu(e.reason)),
    }
}
