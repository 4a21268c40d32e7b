//! GPUs as separate places, end to end: the real `hangard` on a fake NVML with two 16 GiB
//! GPUs and the fake `vllm serve`, whose engine core takes its memory on the GPUs its
//! `CUDA_VISIBLE_DEVICES` names (split evenly over several, or unevenly as a list says).
//! Each GPU has its own budget; the figures before a load are the model files' size
//! (sparse files here).

use std::path::Path;

use serde_json::{Value, json};

use crate::support::{Server, get, load, post, row, temp_dir};

/// The fake `vllm serve`.
const FAKE_VLLM: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../crates/hangar-backend-process/tests/fake-vllm/vllm"
);

const MIB: u64 = 1 << 20;

/// A `vllm_serve` model whose file (sparse) is `mib` MiB, spread over `split` GPUs.
fn model(dir: &Path, name: &str, mib: u64, split: u32) -> Value {
    let file = dir.join(format!("{name}.safetensors"));
    std::fs::File::create(&file).unwrap().set_len(mib * MIB).unwrap();
    json!({
        "backend": "vllm_serve", "vllm_binary_path": FAKE_VLLM, "model_path": file,
        "device": "gpu", "gpu_split": split, "load_timeout_s": 60
    })
}

/// A running child's environment variable, from `/proc/<pid>/environ`.
fn child_env(row: &Value, var: &str) -> Option<String> {
    let pid = row["runtime_details"][0]["pid"].as_u64().expect("a child's pid");
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    environ
        .split(|b| *b == 0)
        .filter_map(|kv| std::str::from_utf8(kv).ok())
        .find_map(|kv| kv.strip_prefix(&format!("{var}=")).map(str::to_owned))
}

/// (GPU, used MiB) of each `gpu` line of the fake NVML's script.
fn used(script: &Path) -> Vec<(u32, u64)> {
    let text = std::fs::read_to_string(script).unwrap();
    text.lines()
        .filter_map(|l| {
            let parts: Vec<&str> = l.split_whitespace().collect();
            (parts.first() == Some(&"gpu"))
                .then(|| (parts[1].parse().unwrap(), parts[2].parse().unwrap()))
        })
        .collect()
}

/// The fake NVML, built in `dir`, and its script: two 16 GiB GPUs with 1,000 MiB in use
/// on each.
fn two_gpus(dir: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let library = hangar_gpu::fake::build(dir).expect("a C compiler (cc) builds the fake NVML");
    let script = library.with_file_name("nvml-script");
    std::fs::write(&script, "gpu 0 1000 16384 NVIDIA Fake A\ngpu 1 1000 16384 NVIDIA Fake B\n")
        .unwrap();
    (library, script)
}

#[tokio::test]
async fn models_are_placed_on_gpus_of_their_own_evicting_only_where_room_is_needed() {
    let dir = temp_dir("gpu-places");
    let (library, script) = two_gpus(&dir);
    let config = json!({
        "vram_budget": 15000,
        "max_loaded_models": { "llm": 4 },
        "children": { "pass_env": ["FAKE_VLLM_*"] },
        "models": {
            "a": model(&dir, "a", 12000, 1), "b": model(&dir, "b", 12000, 1),
            "c": model(&dir, "c", 12000, 1), "big": model(&dir, "big", 20000, 1),
            "split": model(&dir, "split", 20000, 2),
            "tall": model(&dir, "tall", 14500, 1),
        }
    });
    let env = [
        ("HANGAR_NVML_LIBRARY", library.to_str().unwrap()),
        ("FAKE_VLLM_NVML_SCRIPT", script.to_str().unwrap()),
        (
            "FAKE_VLLM_GPU_MIB",
            r#"{"a": 12000, "b": 12000, "c": 12000, "big": 20000, "split": [12000, 8000]}"#,
        ),
    ];
    let server = Server::start_with(&config, &[], &env);

    // a goes to GPU 0 (both are free: the lower index), under PCI bus order.
    let (status, a) = load(&server, "a", json!({})).await;
    assert_eq!(status, 200, "{a}");
    let holds = json!([{ "gpu": 0, "mib": 12000 }]);
    assert_eq!(
        a["placement"],
        json!({ "gpus": [0], "source": "chosen", "holds": holds }),
        "measured on GPU 0: {a}"
    );
    assert_eq!(child_env(&a, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0"));
    assert_eq!(child_env(&a, "CUDA_DEVICE_ORDER").as_deref(), Some("PCI_BUS_ID"));

    // b does not fit beside a on GPU 0, and GPU 1 is free: side by side, nothing evicted.
    let (status, b) = load(&server, "b", json!({})).await;
    assert_eq!(status, 200, "{b}");
    assert_eq!(b["placement"]["gpus"], json!([1]), "{b}");
    assert_eq!(child_env(&b, "CUDA_VISIBLE_DEVICES").as_deref(), Some("1"));
    assert_eq!(row(&server, "a").await["runtime_state"], "loaded");
    // Measured on its own GPU: the delta and the engine's own memory there.
    let b = row(&server, "b").await;
    assert_eq!(
        (&b["vram_estimate_mib"], &b["vram_detail"]["process_tree"]["gpus"]),
        (&json!(12000), &json!([1]))
    );
    assert_eq!(used(&script), [(0, 13000), (1, 13000)]);
    let (_, memory) = get(&server, "/v1/admin/gpu-memory").await;
    assert_eq!(memory["gpus"][0]["holders"], json!([{ "model": "a", "mib": 12000 }]), "{memory}");
    assert_eq!(memory["gpus"][1]["holders"], json!([{ "model": "b", "mib": 12000 }]), "{memory}");
    let placed: Vec<(&str, &Value)> = memory["models"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| (m["name"].as_str().unwrap(), &m["placement"]["gpus"]))
        .collect();
    assert_eq!(placed[..3], [("a", &json!([0])), ("b", &json!([1])), ("c", &Value::Null)]);

    // a serves a request: b is now the least recently used, so c takes GPU 1 from b alone.
    let chat = json!({ "model": "a", "messages": [{ "role": "user", "content": "hi" }] });
    let (status, answer) = post(&server, "/v1/chat/completions", chat).await;
    assert_eq!(status, 200, "{answer}");
    let (status, c) = load(&server, "c", json!({})).await;
    assert_eq!(status, 200, "{c}");
    assert_eq!(c["placement"]["gpus"], json!([1]), "{c}");
    assert_eq!(row(&server, "b").await["runtime_state"], "unloaded");
    assert_eq!(row(&server, "a").await["runtime_state"], "loaded", "GPU 0 needed no room");

    // 20,000 MiB fits no single GPU's 15,000 budget: refused before anything is evicted,
    // with each GPU's side.
    let (status, refused) = load(&server, "big", json!({})).await;
    assert_eq!(status, 507, "{refused}");
    let shortfall = &refused["error"]["vram_shortfall"];
    assert_eq!((&shortfall["needed_mib"], &shortfall["gpus_needed"]), (&json!(20000), &json!(1)));
    let sides: Vec<(u64, u64)> = shortfall["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| (g["gpu"].as_u64().unwrap(), g["missing_mib"].as_u64().unwrap()))
        .collect();
    assert_eq!(sides, [(0, 6000), (1, 6000)], "{shortfall}");
    for model in ["a", "c"] {
        assert_eq!(row(&server, model).await["runtime_state"], "loaded", "{model} kept");
    }

    // Split over both GPUs, 10,000 MiB on each by its files: a and c make room, and the
    // engine is told to split (vLLM's tensor parallelism) over the two GPUs it sees. It
    // takes 12,000 on the first and 8,000 on the second, and that split is its figure.
    let (status, split) = load(&server, "split", json!({})).await;
    assert_eq!(status, 200, "{split}");
    let split_holds = json!([{ "gpu": 0, "mib": 12000 }, { "gpu": 1, "mib": 8000 }]);
    assert_eq!(
        split["placement"],
        json!({ "gpus": [0, 1], "source": "chosen", "holds": split_holds }),
        "{split}"
    );
    assert_eq!(child_env(&split, "CUDA_VISIBLE_DEVICES").as_deref(), Some("0,1"));
    let command = split["runtime_details"][0]["command"].as_str().unwrap().to_owned();
    assert!(command.contains(" --tensor-parallel-size=2"), "{command}");
    assert_eq!(used(&script), [(0, 13000), (1, 9000)]);
    let tree = &row(&server, "split").await["vram_detail"]["process_tree"];
    let per_gpu = json!([{ "gpu": 0, "mib": 12000 }, { "gpu": 1, "mib": 8000 }]);
    assert_eq!((&tree["mib"], &tree["per_gpu"]), (&json!(20000), &per_gpu), "{tree}");
    for model in ["a", "c"] {
        assert_eq!(row(&server, model).await["runtime_state"], "unloaded", "{model} evicted");
    }
    // A load may name its GPU (the row says the request chose), within the budget's rules:
    // b on GPU 0 takes it from the split model, which holds memory there.
    let (status, refused) = load(&server, "b", json!({ "gpus": [7] })).await;
    assert_eq!(status, 507, "no GPU 7 here: {refused}");
    let message = refused["error"]["message"].as_str().unwrap();
    assert!(message.contains("only 0 of the GPUs it may use"), "{message}");
    assert_eq!(refused["error"]["vram_shortfall"]["gpus"], json!([]), "{refused}");
    let (status, refused) = load(&server, "b", json!({ "gpus": [1, 1] })).await;
    assert_eq!((status, &refused["error"]["field"]), (400, &json!("gpus")), "{refused}");
    let constraints = &row(&server, "b").await["load_constraints"]["gpus"];
    assert_eq!(constraints["kind"], "gpu_list", "{constraints}");

    // Prometheus labels the split model's memory by GPU, as measured there.
    let metrics = reqwest::get(server.url("/metrics")).await.unwrap().text().await.unwrap();
    for (gpu, mib) in [(0, 12000), (1, 8000)] {
        let line =
            format!("hangar_model_gpu_memory_bytes{{model=\"split\",gpu=\"{gpu}\"}} {}", mib * MIB);
        assert!(metrics.lines().any(|l| l == line), "no `{line}` in:\n{metrics}");
    }
    // Admission counts the measured split too: on GPU 1, 6,000 MiB free and the split
    // model's 8,000 are 500 short of 14,500 (an even share, 10,000, would have evicted it
    // for nothing).
    let (status, refused) = load(&server, "tall", json!({ "gpus": [1] })).await;
    assert_eq!(status, 507, "{refused}");
    let sides = &refused["error"]["vram_shortfall"]["gpus"];
    assert_eq!((&sides[0]["gpu"], &sides[0]["missing_mib"]), (&json!(1), &json!(500)), "{sides}");
    assert_eq!(row(&server, "split").await["runtime_state"], "loaded", "nothing evicted");
    assert!(!metrics.contains("hangar_model_gpu_memory_bytes{model=\"a\""), "a is gone");

    let (status, b) = load(&server, "b", json!({ "gpus": [1] })).await;
    assert_eq!(status, 200, "{b}");
    let holds = json!([{ "gpu": 1, "mib": 12000 }]);
    assert_eq!(b["placement"], json!({ "gpus": [1], "source": "override", "holds": holds }), "{b}");
    assert_eq!(b["load_override"], json!({ "gpus": [1] }), "{b}");
    assert_eq!(child_env(&b, "CUDA_VISIBLE_DEVICES").as_deref(), Some("1"));
    assert_eq!(row(&server, "split").await["runtime_state"], "unloaded", "it held GPU 1");
}

/// `hangard`'s running children (the engines it started).
fn children(server: &Server) -> usize {
    let pids = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok());
    pids.filter(|&pid| {
        crate::support::proc_stat(pid)
            .is_some_and(|(state, ppid, _)| ppid == server.pid() && state != 'Z')
    })
    .count()
}

#[tokio::test]
async fn loads_on_different_gpus_do_not_wait_for_each_other() {
    let dir = temp_dir("gpu-lanes");
    let (library, script) = two_gpus(&dir);
    let on = |name: &str, gpu: u32| {
        let mut m = model(&dir, name, 8000, 1);
        m["gpus"] = json!([gpu]);
        m
    };
    let config = json!({
        "vram_budget": 15000,
        "max_loaded_models": { "llm": 4 },
        "children": { "pass_env": ["FAKE_VLLM_*"] },
        "models": { "left": on("left", 0), "right": on("right", 1), "any": model(&dir, "any", 8000, 1) }
    });
    let env = [
        ("HANGAR_NVML_LIBRARY", library.to_str().unwrap()),
        ("FAKE_VLLM_NVML_SCRIPT", script.to_str().unwrap()),
        ("FAKE_VLLM_GPU_MIB", r#"{"left": 8000, "right": 8000, "any": 8000}"#),
        // Each engine takes 3 s to come up: long enough to see both starting.
        ("FAKE_VLLM_STARTUP_DELAY_MS", "3000"),
    ];
    let server = Server::start_with(&config, &[], &env);
    // Both engines start before either load is answered: their lanes (GPU 0, GPU 1) are
    // apart. One lane for every load would start the second only after the first.
    let answered = std::sync::atomic::AtomicUsize::new(0);
    let load_one = |name: &'static str| {
        let (server, answered) = (&server, &answered);
        async move {
            let answer = load(server, name, json!({})).await;
            answered.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            answer
        }
    };
    let loads = async { tokio::join!(load_one("left"), load_one("right")) };
    let watch = async {
        let mut both = false;
        loop {
            let answers = answered.load(std::sync::atomic::Ordering::SeqCst);
            if answers == 2 {
                break both;
            }
            both |= answers == 0 && children(&server) == 2;
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    let (loads, both) = tokio::join!(loads, watch);
    let ((l, left), (r, right)) = loads;
    assert_eq!((l, r), (200, 200), "left: {left}\nright: {right}\n{}", server.logs());
    assert!(both, "the two engines never ran at once before either load was answered");
    // A model that may use any GPU takes every GPU's lane, and makes room on one of them:
    // left, the least recently used once right has served a request.
    let chat = json!({ "model": "right", "messages": [{ "role": "user", "content": "hi" }] });
    assert_eq!(post(&server, "/v1/chat/completions", chat).await.0, 200);
    assert_eq!(load(&server, "any", json!({})).await.0, 200);
    let states = [row(&server, "left").await, row(&server, "right").await]
        .map(|r| r["runtime_state"].as_str().unwrap().to_owned());
    assert_eq!(states, ["unloaded", "loaded"]);
}
