//! [`NvmlProbe`]: GPU memory from NVIDIA's NVML (`nvml-wrapper`).

use std::ffi::OsStr;

use nvml_wrapper::Nvml;
use nvml_wrapper::enums::device::UsedGpuMemory;

use crate::{GpuProbe, GpuProcess, GpuReading, MIB, Unavailable};

/// The NVML probe: the library loaded and initialised once, read on every call.
pub struct NvmlProbe {
    nvml: Nvml,
}

impl std::fmt::Debug for NvmlProbe {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NvmlProbe")
    }
}

impl NvmlProbe {
    /// Loads NVML (`library`, else the driver's `libnvidia-ml.so.1`) and initialises it.
    ///
    /// # Errors
    /// [`Unavailable`] with NVML's reason: no library, no driver, no permission.
    pub fn init(library: Option<&OsStr>) -> Result<Self, Unavailable> {
        let mut builder = Nvml::builder();
        if let Some(library) = library {
            builder.lib_path(library);
        }
        let nvml = builder.init().map_err(|e| Unavailable {
            reason: match library {
                Some(path) => format!("NVML ({}): {e}", path.to_string_lossy()),
                None => format!("NVML: {e}"),
            },
        })?;
        Ok(Self { nvml })
    }
}

impl GpuProbe for NvmlProbe {
    fn read(&self) -> Result<Vec<GpuReading>, Unavailable> {
        let failed = |what: &str, e: nvml_wrapper::error::NvmlError| Unavailable {
            reason: format!("NVML: {what}: {e}"),
        };
        let count = self.nvml.device_count().map_err(|e| failed("device count", e))?;
        let mut gpus = Vec::with_capacity(count as usize);
        for index in 0..count {
            let device = self.nvml.device_by_index(index).map_err(|e| failed("device", e))?;
            let name = device.name().map_err(|e| failed("device name", e))?;
            let memory = device.memory_info().map_err(|e| failed("memory info", e))?;
            let processes = device
                .running_compute_processes()
                .map_err(|e| failed("compute processes", e))?
                .into_iter()
                .map(|p| GpuProcess {
                    pid: p.pid,
                    used_mib: match p.used_gpu_memory {
                        UsedGpuMemory::Used(bytes) => Some(bytes / MIB),
                        UsedGpuMemory::Unavailable => None,
                    },
                })
                .collect();
            gpus.push(GpuReading {
                index,
                name,
                used_mib: memory.used / MIB,
                total_mib: memory.total / MIB,
                processes,
            });
        }
        Ok(gpus)
    }
}
