//! Where an in-process replica runs: the load's placement (NVML indices, PCI bus order) as
//! llama.cpp's own device list. Engines in child processes are confined with
//! `CUDA_VISIBLE_DEVICES`; this engine shares `hangard`'s process, so it names the devices
//! instead (llama.cpp's `devices`, with `split_mode` none and `main_gpu` 0 for one GPU, a
//! layer split over several).
//!
//! CUDA numbers the GPUs a process sees from 0, in the order of the process's
//! `CUDA_VISIBLE_DEVICES` (when it lists indices) or of all GPUs. That order is PCI bus
//! order under `CUDA_DEVICE_ORDER=PCI_BUS_ID`, as NVML's is; CUDA's default, fastest first,
//! agrees with it unless the GPUs differ. So on a machine with GPUs of different kinds,
//! start `hangard` with `CUDA_DEVICE_ORDER=PCI_BUS_ID` (it warns when it is not set there).

use hangar_backend::LoadError;
use hangar_config::cuda_indices;
use llama_cpp_2::{LlamaBackendDeviceType, list_llama_ggml_backend_devices};

/// llama.cpp's indices of the GPU devices for `placement`: `gpus` are the indices of
/// llama.cpp's GPU devices in CUDA order, `visible` this process's `CUDA_VISIBLE_DEVICES`
/// indices (`None`: every GPU).
///
/// # Errors
/// What is wrong, naming the GPU, when one of the placement is not a device here.
pub fn ggml_devices(
    placement: &[u32],
    visible: Option<&[u32]>,
    gpus: &[usize],
) -> Result<Vec<usize>, String> {
    placement
        .iter()
        .map(|&gpu| {
            let ordinal = match visible {
                Some(visible) => visible.iter().position(|&v| v == gpu).ok_or_else(|| {
                    format!("GPU {gpu} is outside this process's CUDA_VISIBLE_DEVICES {visible:?}")
                })?,
                None => gpu as usize,
            };
            gpus.get(ordinal).copied().ok_or_else(|| {
                format!("GPU {gpu} is not a device llama.cpp sees ({} GPU devices)", gpus.len())
            })
        })
        .collect()
}

/// [`ggml_devices`] for this process: llama.cpp's devices and the environment as they are.
///
/// # Errors
/// [`LoadError::Refused`] when the placement names a GPU llama.cpp does not see.
pub(crate) fn for_placement(placement: &[u32]) -> Result<Vec<usize>, LoadError> {
    if placement.is_empty() {
        return Ok(Vec::new());
    }
    let devices = list_llama_ggml_backend_devices();
    let gpus: Vec<usize> = devices
        .iter()
        .filter(|d| matches!(d.device_type, LlamaBackendDeviceType::Gpu))
        .map(|d| d.index)
        .collect();
    let pci = std::env::var("CUDA_DEVICE_ORDER").is_ok_and(|o| o == "PCI_BUS_ID");
    let kinds: std::collections::HashSet<&str> = devices
        .iter()
        .filter(|d| matches!(d.device_type, LlamaBackendDeviceType::Gpu))
        .map(|d| d.description.as_str())
        .collect();
    if !pci && kinds.len() > 1 {
        tracing::warn!(
            "GPUs of different kinds and no CUDA_DEVICE_ORDER=PCI_BUS_ID: CUDA may number them otherwise than NVML; start hangard with CUDA_DEVICE_ORDER=PCI_BUS_ID"
        );
    }
    let visible = std::env::var("CUDA_VISIBLE_DEVICES").ok().and_then(|v| cuda_indices(&v));
    ggml_devices(placement, visible.as_deref(), &gpus)
        .map_err(|message| LoadError::Refused { message })
}

#[cfg(test)]
mod tests {
    use super::ggml_devices;

    #[test]
    fn a_placement_maps_through_the_visible_gpus_onto_llamas_gpu_devices() {
        // llama.cpp's devices: 0 is the CPU, then CUDA0..CUDA2 as 1..3.
        let gpus = [1, 2, 3];
        assert_eq!(ggml_devices(&[2], None, &gpus), Ok(vec![3]));
        assert_eq!(ggml_devices(&[0, 1], None, &gpus), Ok(vec![1, 2]));
        // Under CUDA_VISIBLE_DEVICES=5,7 the process sees GPU 7 as its second device.
        assert_eq!(ggml_devices(&[7], Some(&[5, 7]), &gpus[..2]), Ok(vec![2]));
        assert!(ggml_devices(&[6], Some(&[5, 7]), &gpus).unwrap_err().contains("GPU 6"));
        assert!(ggml_devices(&[3], None, &gpus).unwrap_err().contains("3 GPU devices"));
        assert!(ggml_devices(&[0], None, &[]).is_err(), "a CPU-only build sees no GPU");
        assert_eq!(ggml_devices(&[], None, &[]), Ok(vec![]));
    }
}
