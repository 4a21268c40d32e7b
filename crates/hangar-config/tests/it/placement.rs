//! Where a model may run: `gpus` (which GPUs, by NVML index) and `gpu_split` (how many at
//! once), their checks, and the GPUs a hand-written `CUDA_VISIBLE_DEVICES` names.

use hangar_config::{ModelConfig, ModelName, cuda_indices};
use serde_json::{Value, json};

fn parse(model: Value) -> Result<ModelConfig, Vec<(String, String)>> {
    ModelConfig::parse(&ModelName::new("m").unwrap(), &model)
        .map_err(|errors| errors.into_iter().map(|e| (e.path, e.message)).collect())
}

fn vllm_serve(extra: Value) -> Value {
    let mut model = json!({ "backend": "vllm_serve", "vllm_model": "org/m" });
    model.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    model
}

#[test]
fn by_default_a_model_may_use_any_gpu_one_at_a_time() {
    let model = parse(json!({ "backend": "stub", "device": "gpu" })).unwrap();
    assert_eq!((model.gpus.as_slice(), model.gpu_split.get()), (&[][..], 1));
    let def = model.definition();
    assert_eq!((&def["gpus"], &def["gpu_split"]), (&Value::Null, &json!(1)));
}

#[test]
fn listed_gpus_and_a_split_are_kept_sorted_and_shown() {
    let model =
        parse(json!({ "backend": "stub", "device": "gpu", "gpus": [3, 1], "gpu_split": 2 }))
            .unwrap();
    assert_eq!((model.gpus.as_slice(), model.gpu_split.get()), (&[1, 3][..], 2));
    assert_eq!(model.definition()["gpus"], json!([1, 3]));
}

#[test]
fn bad_placements_are_refused_with_their_paths() {
    let cases = [
        (json!({ "gpus": [] }), "models.m.gpus", "at least one GPU"),
        (json!({ "gpus": [0, 0] }), "models.m.gpus[1]", "listed twice"),
        (json!({ "gpus": [64] }), "models.m.gpus[0]", "below 64"),
        (json!({ "gpu_split": 0 }), "models.m.gpu_split", "between 1 and 64"),
        (json!({ "gpu_split": 65 }), "models.m.gpu_split", "between 1 and 64"),
        (json!({ "gpus": [0], "gpu_split": 2 }), "models.m.gpu_split", "<= the number of gpus (1)"),
        (json!({ "gpus": "0" }), "models.m.gpus", ""),
        (json!({ "device": "cpu", "gpus": [0] }), "models.m.gpus", "needs a model on a GPU"),
        (json!({ "device": "cpu", "gpu_split": 2 }), "models.m.gpus", "needs a model on a GPU"),
    ];
    for (fields, path, message) in cases {
        let mut model = json!({ "backend": "stub", "device": "gpu" });
        model.as_object_mut().unwrap().extend(fields.as_object().unwrap().clone());
        let errors = parse(model.clone()).expect_err(&model.to_string());
        assert!(
            errors.iter().any(|(p, m)| p == path && m.contains(message)),
            "{model}: {errors:?}"
        );
    }
}

#[test]
fn vllms_tensor_parallel_size_is_the_split_and_must_agree_with_gpu_split() {
    let model = parse(vllm_serve(json!({ "vllm_tensor_parallel_size": 2 }))).unwrap();
    assert_eq!(model.gpu_split.get(), 2);
    let same = vllm_serve(json!({ "vllm_tensor_parallel_size": 2, "gpu_split": 2 }));
    assert_eq!(parse(same).unwrap().gpu_split.get(), 2);
    let errors =
        parse(vllm_serve(json!({ "vllm_tensor_parallel_size": 2, "gpu_split": 4 }))).unwrap_err();
    assert!(
        errors.iter().any(|(p, m)| p == "models.m.gpu_split" && m.contains("(2)")),
        "{errors:?}"
    );
}

#[test]
fn a_hand_written_cuda_visible_devices_names_the_gpus_it_may_use() {
    let env = json!({ "vllm_env": { "CUDA_VISIBLE_DEVICES": "2,1" } });
    assert_eq!(parse(vllm_serve(env)).unwrap().gpus, [1, 2]);
    // `gpus` says it outright; UUIDs name no index, so any GPU.
    let both = json!({ "gpus": [0], "vllm_env": { "CUDA_VISIBLE_DEVICES": "2" } });
    assert_eq!(parse(vllm_serve(both)).unwrap().gpus, [0]);
    let uuid = json!({ "vllm_env": { "CUDA_VISIBLE_DEVICES": "GPU-8d1c" } });
    assert!(parse(vllm_serve(uuid)).unwrap().gpus.is_empty());
    let narrow = json!({ "gpu_split": 2, "vllm_env": { "CUDA_VISIBLE_DEVICES": "3" } });
    let errors = parse(vllm_serve(narrow)).unwrap_err();
    assert!(errors.iter().any(|(p, _)| p == "models.m.gpu_split"), "{errors:?}");
}

#[test]
fn cuda_indices_reads_lists_of_indices_only() {
    assert_eq!(cuda_indices("0"), Some(vec![0]));
    assert_eq!(cuda_indices(" 3, 1"), Some(vec![3, 1]));
    for other in ["", "GPU-1a2b", "0,GPU-1a2b", "MIG-4", "-1", "99"] {
        assert_eq!(cuda_indices(other), None, "{other}");
    }
}
