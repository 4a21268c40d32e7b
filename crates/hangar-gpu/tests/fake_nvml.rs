//! The real NVML code path ([`NvmlProbe`]: `nvml-wrapper` loading a library and calling it)
//! against `tests/fake/libnvidia-ml.c`, a fake `libnvidia-ml.so.1` compiled here with `cc`
//! whose readings the test scripts: two GPUs, processes, memory that changes between reads.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};

use hangar_gpu::{GpuProbe, GpuProcess, NvmlProbe};

/// Compiles the fake library into a fresh directory; its path.
fn fake_library(label: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("hangar-fake-nvml-{label}-{}", std::process::id()));
    hangar_gpu::fake::build(&dir).expect("a C compiler (cc) builds the fake NVML")
}

/// Writes the fake's script, `nvml-script` next to the library (read on every call).
fn script(path: &Path, lines: &str) {
    std::fs::write(path, lines).unwrap();
}

#[test]
fn nvml_readings_come_from_the_library_and_follow_it_between_reads() {
    let library = fake_library("readings");
    let file = library.with_file_name("nvml-script");

    script(&file, "fail init\n");
    let error = NvmlProbe::init(Some(library.as_os_str())).expect_err("the driver is not loaded");
    assert!(error.reason.contains("libnvidia-ml.so.1"), "names the library: {}", error.reason);

    script(
        &file,
        "gpu 0 75603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n\
         gpu 1 1024 24576 NVIDIA GeForce RTX 4090\n\
         proc 0 4242 70000\n\
         proc 0 4343 5000\n",
    );
    let probe = NvmlProbe::init(Some(library.as_os_str())).expect("the fake initialises");
    let gpus = probe.read().expect("reads");
    assert_eq!(gpus.len(), 2);
    assert_eq!(gpus[0].name, "NVIDIA RTX PRO 6000 Blackwell Workstation Edition");
    assert_eq!((gpus[0].used_mib, gpus[0].total_mib), (75603, 97887));
    assert_eq!(gpus[0].used_over_total(), "75603MiB / 97887MiB");
    assert_eq!(
        gpus[0].processes,
        vec![
            GpuProcess { pid: 4242, used_mib: Some(70000) },
            GpuProcess { pid: 4343, used_mib: Some(5000) }
        ]
    );
    assert_eq!((gpus[1].index, gpus[1].used_mib, gpus[1].processes.len()), (1, 1024, 0));

    // A process exits and its memory is released: the next read says so.
    script(
        &file,
        "gpu 0 5603 97887 NVIDIA RTX PRO 6000 Blackwell Workstation Edition\n\
         gpu 1 1024 24576 NVIDIA GeForce RTX 4090\n\
         proc 0 4343 5000\n",
    );
    let gpus = probe.read().expect("reads again");
    assert_eq!(gpus[0].used_mib, 5603);
    assert_eq!(gpus[0].processes, vec![GpuProcess { pid: 4343, used_mib: Some(5000) }]);

    // No library at all: unavailable, with the loader's reason, never a panic.
    let missing = NvmlProbe::init(Some(OsStr::new("/nonexistent/libnvidia-ml.so.1")))
        .expect_err("no such library");
    assert!(missing.reason.contains("/nonexistent/libnvidia-ml.so.1"), "{}", missing.reason);
    let _ = std::fs::remove_dir_all(library.parent().unwrap());
}
