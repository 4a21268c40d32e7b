//! One test per eviction rule, through the public API.

use std::num::NonZeroU32;
use std::time::{Duration, Instant};

use hangar_config::{Device, MaxLoadedModels, ModelName, ModelType};
use hangar_eviction::{
    EvictionPlan, EvictionReason, Incoming, LoadFailure, LoadedModel, Memory, Victim, plan_load,
    plan_load_within, plan_retry_after_failure, plan_second_copy,
};

use EvictionReason::{ExclusiveDevice, LoadFailureRetry, SlotLimit};
use ModelType::{Embedding, Llm, Reranking};

fn name(s: &str) -> ModelName {
    ModelName::new(s).unwrap()
}

/// A loaded model used `secs` seconds after a common base instant.
fn model(n: &str, ty: ModelType, device: Device, secs: u64, inflight: u32) -> LoadedModel {
    // One base per process, so models built in one test compare by `secs` only.
    static BASE: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
    let base = *BASE.get_or_init(Instant::now);
    LoadedModel {
        name: name(n),
        model_type: ty,
        device,
        last_use: base + Duration::from_secs(secs),
        inflight,
        held: false,
        vram_mib: 0,
        asleep: false,
        sleep_frees_mib: 0,
    }
}

fn idle(n: &str, ty: ModelType, secs: u64) -> LoadedModel {
    model(n, ty, Device::GPU, secs, 0)
}

fn incoming(n: &str, ty: ModelType, device: Device) -> Incoming {
    Incoming { name: name(n), model_type: ty, device }
}

fn limits(llm: u32, embedding: u32, reranking: u32) -> MaxLoadedModels {
    let nz = |n| NonZeroU32::new(n).unwrap();
    MaxLoadedModels { llm: nz(llm), embedding: nz(embedding), reranking: nz(reranking) }
}

/// The plan as `(name, reason, wait_for_drain)` triples, in order.
fn summary(plan: &EvictionPlan) -> Vec<(&str, EvictionReason, bool)> {
    plan.victims.iter().map(|v| (v.name.as_str(), v.reason, v.wait_for_drain)).collect()
}

fn check(
    loaded: &[LoadedModel],
    new: &Incoming,
    limits: &MaxLoadedModels,
    expected: &[(&str, EvictionReason, bool)],
) {
    let plan = plan_load(loaded, new, limits);
    assert_eq!(summary(&plan), expected, "loading {} into {loaded:#?}", new.name);
    // The plan never depends on the order of the loaded models.
    let mut reversed = loaded.to_vec();
    reversed.reverse();
    assert_eq!(plan_load(&reversed, new, limits), plan);
}

#[test]
fn free_slot_evicts_nothing() {
    let loaded = [idle("a", Llm, 1), idle("b", Llm, 2)];
    check(&loaded, &incoming("new", Llm, Device::GPU), &limits(3, 1, 1), &[]);
    assert!(plan_load(&loaded, &incoming("new", Llm, Device::GPU), &limits(3, 1, 1)).is_empty());
}

#[test]
fn a_slot_goes_from_a_sleeping_model_before_an_awake_idle_one() {
    let asleep = |n, secs| LoadedModel { asleep: true, ..idle(n, Llm, secs) };
    // b was used last, but sleeps: it goes before a, the least recently used.
    let loaded = [idle("a", Llm, 1), asleep("b", 5), idle("c", Llm, 3)];
    let new = incoming("new", Llm, Device::GPU);
    check(&loaded, &new, &limits(3, 1, 1), &[("b", SlotLimit, false)]);
    // Among sleeping ones, the least recently used first; then the awake ones.
    let loaded = [idle("a", Llm, 1), asleep("b", 5), asleep("c", 3)];
    let expected = [("c", SlotLimit, false), ("b", SlotLimit, false)];
    check(&loaded, &new, &limits(2, 1, 1), &expected);
    // A sleeping model with a request waiting for its wake is busy, not first.
    let waited = LoadedModel { inflight: 1, ..asleep("b", 5) };
    let loaded = [idle("a", Llm, 1), waited, idle("c", Llm, 3)];
    check(&loaded, &new, &limits(3, 1, 1), &[("a", SlotLimit, false)]);
}

#[test]
fn full_slot_evicts_lru_of_same_type() {
    let loaded = [idle("a", Llm, 5), idle("b", Llm, 1), idle("c", Llm, 3)];
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(3, 1, 1),
        &[("b", SlotLimit, false)],
    );
    // Over the limit (the limit was lowered): evict just enough to free one slot.
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(2, 1, 1),
        &[("b", SlotLimit, false), ("c", SlotLimit, false)],
    );
}

#[test]
fn other_types_are_never_evicted_for_slots() {
    // The embedding and reranking models are older than the llm, and their own slots are
    // full, but an llm load only looks at llm slots.
    let loaded = [idle("emb", Embedding, 1), idle("rr", Reranking, 2), idle("chat", Llm, 9)];
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(1, 1, 1),
        &[("chat", SlotLimit, false)],
    );
    check(
        &loaded,
        &incoming("new-emb", Embedding, Device::GPU),
        &limits(1, 1, 1),
        &[("emb", SlotLimit, false)],
    );
}

#[test]
fn lru_ties_break_by_name() {
    let loaded = [idle("zeta", Llm, 1), idle("alpha", Llm, 1), idle("mid", Llm, 1)];
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(2, 1, 1),
        &[("alpha", SlotLimit, false), ("mid", SlotLimit, false)],
    );
}

#[test]
fn idle_models_are_preferred_over_busy() {
    // "busy" is the least recently used, but it is serving a request; "idle" is evicted
    // instead and the load need not wait.
    let loaded = [model("busy", Llm, Device::GPU, 1, 2), idle("idle", Llm, 5)];
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(2, 1, 1),
        &[("idle", SlotLimit, false)],
    );
}

#[test]
fn busy_victim_is_marked_wait_for_drain() {
    let loaded = [
        model("busy-old", Llm, Device::GPU, 1, 1),
        model("busy-new", Llm, Device::GPU, 2, 3),
        idle("idle", Llm, 9),
    ];
    // Two victims needed, one idle exists: take it, then the least recently used busy one.
    check(
        &loaded,
        &incoming("new", Llm, Device::GPU),
        &limits(2, 1, 1),
        &[("idle", SlotLimit, false), ("busy-old", SlotLimit, true)],
    );
    let only_busy = [model("busy", Llm, Device::GPU, 1, 1)];
    let plan = plan_load(&only_busy, &incoming("new", Llm, Device::GPU), &limits(1, 1, 1));
    assert_eq!(
        plan.victims,
        [Victim { name: name("busy"), reason: SlotLimit, wait_for_drain: true }]
    );
    assert!(plan.must_wait_for_drain());
}

#[test]
fn npu_is_exclusive_across_types() {
    // An embedding model holds the NPU (hybrid gpu|npu); loading an NPU llm evicts it even
    // though embedding slots have nothing to do with llm slots, and even while it is busy.
    let loaded = [
        model("npu-emb", Embedding, Device::GPU | Device::NPU, 5, 1),
        idle("gpu-rr", Reranking, 1),
    ];
    check(
        &loaded,
        &incoming("npu-llm", Llm, Device::NPU),
        &limits(4, 4, 4),
        &[("npu-emb", ExclusiveDevice, true)],
    );
}

#[test]
fn non_npu_load_ignores_npu_holders() {
    let loaded = [model("npu-llm", Llm, Device::NPU, 1, 0), idle("gpu-emb", Embedding, 2)];
    check(&loaded, &incoming("gpu-llm", Llm, Device::GPU | Device::CPU), &limits(2, 1, 1), &[]);
    // With a full llm slot, the NPU holder is evicted only as the LRU llm, for the slot.
    check(
        &loaded,
        &incoming("gpu-llm", Llm, Device::GPU),
        &limits(1, 1, 1),
        &[("npu-llm", SlotLimit, false)],
    );
}

#[test]
fn npu_victim_frees_its_type_slot_too() {
    // The llm slot is full, but its occupant holds the NPU and goes for that reason: no
    // second (GPU) llm is evicted for the slot.
    let loaded = [idle("gpu-llm", Llm, 1), model("npu-llm", Llm, Device::NPU, 9, 0)];
    check(
        &loaded,
        &incoming("new-npu", Llm, Device::NPU),
        &limits(2, 1, 1),
        &[("npu-llm", ExclusiveDevice, false)],
    );
    // With limit 1 and one llm left after the NPU eviction, that one goes for the slot.
    check(
        &loaded,
        &incoming("new-npu", Llm, Device::NPU),
        &limits(1, 1, 1),
        &[("npu-llm", ExclusiveDevice, false), ("gpu-llm", SlotLimit, false)],
    );
}

#[test]
fn already_loaded_model_plans_nothing() {
    let loaded = [model("npu", Llm, Device::NPU, 1, 0), idle("other", Llm, 2)];
    // Even though a fresh NPU llm would evict both under these limits.
    check(&loaded, &incoming("npu", Llm, Device::NPU), &limits(1, 1, 1), &[]);
}

#[test]
fn not_found_failure_evicts_nothing() {
    let loaded = [idle("a", Llm, 1), idle("b", Embedding, 2)];
    let new = incoming("new", Llm, Device::GPU);
    assert_eq!(plan_retry_after_failure(&loaded, &new, LoadFailure::NotFound), None);
}

#[test]
fn other_failure_evicts_everything_else() {
    let loaded = [
        model("busy-emb", Embedding, Device::GPU, 3, 1),
        idle("rr", Reranking, 1),
        model("failed", Llm, Device::GPU, 0, 0),
        model("npu", Llm, Device::NPU, 2, 0),
    ];
    let every = incoming("failed", Llm, Device::GPU | Device::NPU | Device::CPU);
    let plan = plan_retry_after_failure(&loaded, &every, LoadFailure::Other).unwrap();
    assert_eq!(
        summary(&plan),
        [
            ("rr", LoadFailureRetry, false),
            ("npu", LoadFailureRetry, false),
            ("busy-emb", LoadFailureRetry, true),
        ]
    );
    let x = incoming("x", Llm, Device::GPU);
    let nothing_loaded = plan_retry_after_failure(&[], &x, LoadFailure::Other).unwrap();
    assert!(nothing_loaded.is_empty());
}

#[test]
fn a_failure_evicts_only_models_on_the_failed_ones_devices() {
    let loaded = [
        model("on-gpu", Llm, Device::GPU, 1, 0),
        model("on-cpu", Embedding, Device::CPU, 2, 0),
        model("split", Llm, Device::GPU | Device::CPU, 3, 0),
        model("npu", Reranking, Device::NPU, 4, 0),
    ];
    let retry = |device| {
        let plan =
            plan_retry_after_failure(&loaded, &incoming("f", Llm, device), LoadFailure::Other);
        let plan = plan.unwrap();
        plan.names().map(ModelName::as_str).map(str::to_owned).collect::<Vec<_>>()
    };
    assert_eq!(retry(Device::CPU), ["on-cpu", "split"], "a CPU model's failure leaves the GPU");
    assert_eq!(retry(Device::GPU), ["on-gpu", "split"]);
    assert_eq!(retry(Device::NPU), ["npu"]);
}

#[test]
fn default_limits_allow_one_of_each_type() {
    let defaults = MaxLoadedModels::default();
    let mut loaded = Vec::new();
    for (i, ty) in ModelType::ALL.into_iter().enumerate() {
        let new = incoming(ty.as_str(), ty, Device::GPU);
        check(&loaded, &new, &defaults, &[]);
        loaded.push(idle(ty.as_str(), ty, u64::try_from(i).unwrap()));
    }
    // A second model of any type replaces the first of that type, and only it.
    check(
        &loaded,
        &incoming("emb2", Embedding, Device::GPU),
        &defaults,
        &[("embedding", SlotLimit, false)],
    );
}

#[test]
fn plan_helpers_describe_the_victims() {
    let loaded = [model("a", Llm, Device::GPU, 1, 1), idle("b", Llm, 2)];
    let plan = plan_load(&loaded, &incoming("new", Llm, Device::GPU), &limits(1, 1, 1));
    assert_eq!(plan.len(), 2);
    assert_eq!(plan.names().map(ModelName::as_str).collect::<Vec<_>>(), ["b", "a"]);
    assert!(plan.contains("a") && !plan.contains("new"));
    assert!(plan.get("a").unwrap().wait_for_drain);
    assert_eq!(SlotLimit.to_string(), "slot_limit");
    assert_eq!(ExclusiveDevice.as_str(), "exclusive_device");
    assert_eq!(LoadFailureRetry.as_str(), "load_failure_retry");
}

/// A loaded model holding `mib` of GPU memory.
fn on_gpu(n: &str, ty: ModelType, secs: u64, inflight: u32, mib: u64) -> LoadedModel {
    LoadedModel { vram_mib: mib, ..model(n, ty, Device::GPU, secs, inflight) }
}

/// Admission by GPU memory, one row per case: the loaded models (all LLM slots free
/// unless a row says otherwise), the free budget and the need, then the plan.
#[test]
fn memory_plans_table() {
    use EvictionReason::VramBudget;
    struct Row {
        what: &'static str,
        loaded: Vec<LoadedModel>,
        limits: MaxLoadedModels,
        free: i64,
        need: u64,
        victims: Vec<(&'static str, EvictionReason, bool)>,
        missing: Option<u64>,
    }
    let wide = limits(4, 4, 4);
    let rows = [
        Row {
            what: "fits: nothing evicted",
            loaded: vec![on_gpu("a", Llm, 1, 0, 5000)],
            limits: wide,
            free: 3000,
            need: 3000,
            victims: vec![],
            missing: None,
        },
        Row {
            what: "one LRU idle model of another type is enough",
            loaded: vec![
                on_gpu("emb", Embedding, 1, 0, 1000),
                on_gpu("old", Llm, 2, 0, 4000),
                on_gpu("recent", Llm, 3, 0, 4000),
            ],
            limits: wide,
            free: 500,
            need: 1200,
            victims: vec![("emb", VramBudget, false)],
            missing: None,
        },
        Row {
            what: "idle before busy, however recent",
            loaded: vec![on_gpu("busy", Llm, 1, 2, 4000), on_gpu("idle", Llm, 5, 0, 4000)],
            limits: wide,
            free: 0,
            need: 3000,
            victims: vec![("idle", VramBudget, false)],
            missing: None,
        },
        Row {
            what: "busy models drain when idle ones are not enough",
            loaded: vec![on_gpu("busy", Llm, 1, 2, 4000), on_gpu("idle", Llm, 5, 0, 1000)],
            limits: wide,
            free: 0,
            need: 3000,
            victims: vec![("idle", VramBudget, false), ("busy", VramBudget, true)],
            missing: None,
        },
        Row {
            what: "the slot victim's memory counts first",
            loaded: vec![on_gpu("a", Llm, 1, 0, 3000), on_gpu("b", Llm, 2, 0, 3000)],
            limits: limits(2, 1, 1),
            free: 1000,
            need: 3500,
            victims: vec![("a", SlotLimit, false)],
            missing: None,
        },
        Row {
            what: "over budget already: more than the need is freed",
            loaded: vec![on_gpu("a", Llm, 1, 0, 2000), on_gpu("b", Llm, 2, 0, 2000)],
            limits: wide,
            free: -1500,
            need: 2000,
            victims: vec![("a", VramBudget, false), ("b", VramBudget, false)],
            missing: None,
        },
        Row {
            what: "CPU models free nothing and stay",
            loaded: vec![on_gpu("cpu", Llm, 1, 0, 0), on_gpu("gpu", Llm, 2, 0, 800)],
            limits: wide,
            free: 0,
            need: 500,
            victims: vec![("gpu", VramBudget, false)],
            missing: None,
        },
        Row {
            what: "held models stay: the shortfall says what is missing",
            loaded: vec![
                LoadedModel { held: true, ..on_gpu("pinned", Llm, 1, 0, 6000) },
                on_gpu("small", Embedding, 2, 0, 1000),
            ],
            limits: wide,
            free: 500,
            need: 4000,
            victims: vec![],
            missing: Some(2500),
        },
        Row {
            what: "a model larger than the whole budget",
            loaded: vec![],
            limits: wide,
            free: 8000,
            need: 80_000,
            victims: vec![],
            missing: Some(72_000),
        },
    ];
    for row in rows {
        let memory = Memory { free_mib: row.free, needed_mib: row.need };
        let plan =
            plan_load_within(&row.loaded, &incoming("new", Llm, Device::GPU), &row.limits, &memory);
        assert_eq!(summary(&plan), row.victims, "{}: {plan:#?}", row.what);
        assert_eq!(plan.shortfall.as_ref().map(|s| s.missing_mib), row.missing, "{}", row.what);
    }
}

#[test]
fn a_shortfall_lists_every_holder_largest_first_with_whether_it_is_held() {
    let loaded = [
        LoadedModel { held: true, ..on_gpu("pinned", Llm, 1, 0, 6000) },
        on_gpu("small", Embedding, 2, 0, 1000),
        on_gpu("cpu", Reranking, 3, 0, 0),
    ];
    let memory = Memory { free_mib: -200, needed_mib: 4000 };
    let plan =
        plan_load_within(&loaded, &incoming("new", Llm, Device::GPU), &limits(4, 4, 4), &memory);
    let short = plan.shortfall.expect("short of VRAM");
    assert_eq!((short.needed_mib, short.free_mib, short.missing_mib), (4000, -200, 3200));
    let holders: Vec<_> =
        short.holders.iter().map(|(n, mib, held)| (n.as_str(), *mib, *held)).collect();
    assert_eq!(holders, [("pinned", 6000, true), ("small", 1000, false)]);
    // Blocked by a held model for slots: the slot answer wins, memory is not looked at.
    let slots = plan_load_within(
        &loaded[..1],
        &incoming("new", Llm, Device::GPU),
        &limits(1, 1, 1),
        &memory,
    );
    assert_eq!((slots.is_blocked(), slots.shortfall), (true, None));
    // Already loaded: nothing to plan, whatever the memory.
    let again = plan_load_within(
        &loaded,
        &incoming("small", Embedding, Device::GPU),
        &limits(4, 4, 4),
        &memory,
    );
    assert!(again.is_empty() && again.shortfall.is_none());
}

/// A reload or a weight update loads a second copy next to the model's runtimes: no slot is
/// needed, only memory, and the model itself is held (never its own victim).
#[test]
fn a_second_copy_needs_memory_not_a_slot_and_never_evicts_the_model_itself() {
    let me = || on_gpu("me", Llm, 1, 0, 3000);
    // (what, loaded, free MiB, needed MiB, victims, MiB missing)
    type Row = (&'static str, Vec<LoadedModel>, i64, u64, Vec<&'static str>, Option<u64>);
    let rows: Vec<Row> = vec![
        ("fits: nothing evicted, even with every slot taken", vec![me()], 4000, 3000, vec![], None),
        (
            "idle others go, least recently used first; the model is older but stays",
            vec![me(), on_gpu("b", Embedding, 3, 0, 1000), on_gpu("c", Llm, 2, 0, 1000)],
            1200,
            3000,
            vec!["c", "b"],
            None,
        ),
        (
            "busy others go after idle ones",
            vec![me(), on_gpu("busy", Llm, 2, 1, 2000), on_gpu("idle", Llm, 3, 0, 500)],
            500,
            3000,
            vec!["idle", "busy"],
            None,
        ),
        (
            "only the model itself holds memory: refused, not evicted",
            vec![me()],
            1000,
            3000,
            vec![],
            Some(2000),
        ),
    ];
    for (what, loaded, free, need, victims, missing) in rows {
        let memory = Memory { free_mib: free, needed_mib: need };
        let plan = plan_second_copy(&loaded, &name("me"), &memory);
        let names: Vec<&str> = plan.victims.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, victims, "{what}");
        assert!(plan.victims.iter().all(|v| v.reason == EvictionReason::VramBudget), "{what}");
        assert_eq!(plan.shortfall.as_ref().map(|s| s.missing_mib), missing, "{what}");
        if let Some(short) = &plan.shortfall {
            assert!(short.holders.iter().any(|(n, _, held)| n.as_str() == "me" && *held), "{what}");
        }
    }
}
