//! The tables `cargo xtask bench proxy` prints: every path's figures, and Hangar against its
//! reference with the goal of each ratio.

use super::*;

/// One line of the goals table.
pub(super) struct Row {
    measure: String,
    hangar: f64,
    reference: f64,
    /// `None` when the ratio means nothing (a reference ≤ 0).
    ratio: Option<f64>,
    goal: String,
    met: Option<bool>,
}

pub(super) fn print_tables(bench: &Bench, versions: &Versions, paths: &Paths, swap: &Swaps) {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    println!();
    println!(
        "{FIXTURE} on {cores} cores ({}); non-streamed chat completions, temperature 0, \
         max_tokens {MAX_TOKENS}",
        cpu_model()
    );
    println!("hangar: {} ({}, {})", bench.hangard.display(), versions.hangar, versions.commit);
    println!("llama-server: {} ({})", bench.llama_server.display(), versions.llama_server);
    println!("nginx: {} ({})", bench.nginx.display(), versions.nginx);
    println!("upstream of every path (Hangar's child): {}", paths.command);
    if let Some(threads) = &paths.threads {
        println!("upstream threads: {threads}");
    }
    println!(
        "client: ureq, keep-alive connections on every path (one per path in the latency part, \
         one per client thread in the throughput part; idle ones reused for up to {} s)",
        IDLE_AGE.as_secs()
    );
    println!();

    let [direct, hangar, plain, tuned] = &paths.figures;
    let (d50, d99) = (us(percentile(&direct.latency, 0.5)), us(percentile(&direct.latency, 0.99)));
    println!(
        "| path | p50 µs | p99 µs | p50 − direct's µs | p99 − direct's µs | requests/s, \
         {CLIENTS} clients | vs direct | p50 / p99 / max ms, {CLIENTS} clients |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for f in &paths.figures {
        let (p50, p99) = (us(percentile(&f.latency, 0.5)), us(percentile(&f.latency, 0.99)));
        println!(
            "| {} | {p50:.0} | {p99:.0} | {:.0} | {:.0} | {:.0} | {:.2} | {:.1} / {:.1} / {:.1} |",
            f.name,
            p50 - d50,
            p99 - d99,
            f.requests_per_second(),
            f.requests_per_second() / direct.requests_per_second(),
            ms(percentile(&f.loaded, 0.5)),
            ms(percentile(&f.loaded, 0.99)),
            ms(percentile(&f.loaded, 1.0)),
        );
    }
    println!();

    // The goal's statistic: quantiles of the same-round differences (proxy − direct), the
    // latency each request gained by its proxy. Drift between rounds cannot move them, where
    // a difference of two paths' quantiles can come out negative.
    let added = |f: &PathFigures, q: f64| {
        let mut d: Vec<f64> =
            f.latency.iter().zip(&direct.latency).map(|(p, d)| us(*p) - us(*d)).collect();
        d.sort_by(f64::total_cmp);
        d.get(rank(d.len(), q)).copied().unwrap_or_default()
    };
    let (h50, h99) = (added(hangar, 0.5), added(hangar, 0.99));
    let at_most = |h: f64, r: f64, goal: f64| {
        // A ratio of two added latencies means something only when both add something. A
        // Hangar that adds nothing meets any goal; otherwise the ratio decides.
        let ratio = (r > 0.0 && h > 0.0).then(|| h / r);
        let met = if h <= 0.0 { Some(true) } else { ratio.map(|x| x <= goal) };
        (ratio, met)
    };
    let mut rows = Vec::new();
    let mut noise = Vec::new();
    // Both sides on their defaults is the comparison of the goal; the tuned nginx is the
    // second, stricter reference.
    for (nginx, which) in [(plain, "goal"), (tuned, "second reference")] {
        let (n50, n99) = (added(nginx, 0.5), added(nginx, 0.99));
        for (label, h, n) in [("p50", h50, n50), ("p99", h99, n99)] {
            let (ratio, met) = at_most(h, n, LATENCY_GOAL);
            rows.push(Row {
                measure: format!(
                    "added latency {label} µs, {LATENCY_REQUESTS} same-round differences (ref: \
                     {}, {which})",
                    nginx.name
                ),
                hangar: h,
                reference: n,
                ratio,
                goal: format!("≤ {LATENCY_GOAL}"),
                met,
            });
            if n < NOISE_US {
                noise.push(format!("{} adds {n:.0} µs at {label}", nginx.name));
            }
        }
    }
    let (hr, dr) = (hangar.requests_per_second(), direct.requests_per_second());
    rows.push(Row {
        measure: format!("requests/s, {CLIENTS} clients (ref: direct)"),
        hangar: hr,
        reference: dr,
        ratio: Some(hr / dr),
        goal: format!("≥ {THROUGHPUT_GOAL}"),
        met: Some(hr / dr >= THROUGHPUT_GOAL),
    });
    let totals = |swaps: &[Swap]| swaps.iter().map(|s| s.total).collect::<Vec<_>>();
    let (mut all_hangar, mut all_raw) = (Vec::new(), Vec::new());
    for (i, label) in ["A → B", "B → A"].into_iter().enumerate() {
        let (mut h, mut r) = (totals(&swap.hangar[i]), totals(&swap.raw[i]));
        all_hangar.extend(&h);
        all_raw.extend(&r);
        let (h, r) = (ms(median(&mut h)), ms(median(&mut r)));
        rows.push(Row {
            measure: format!("swap {label} ms, median of {SWAP_ROUNDS} (ref: by hand)"),
            hangar: h,
            reference: r,
            ratio: Some(h / r),
            goal: format!("≤ {SWAP_GOAL}"),
            met: Some(h / r <= SWAP_GOAL),
        });
    }
    let (h, r) = (ms(median(&mut all_hangar)), ms(median(&mut all_raw)));
    rows.push(Row {
        measure: format!("swap ms, both ways, median of {} (ref: by hand)", 2 * SWAP_ROUNDS),
        hangar: h,
        reference: r,
        ratio: Some(h / r),
        goal: format!("≤ {SWAP_GOAL}"),
        met: Some(h / r <= SWAP_GOAL),
    });

    println!("| measure | hangar | reference | ratio | goal | met? |");
    println!("|---|---:|---:|---:|---:|---|");
    for row in &rows {
        let ratio = row.ratio.map_or_else(|| "n/a".to_owned(), |r| format!("{r:.2}"));
        let met = match row.met {
            Some(true) => "yes",
            Some(false) => "no",
            None => "n/a",
        };
        println!(
            "| {} | {:.1} | {:.1} | {ratio} | {} | {met} |",
            row.measure, row.hangar, row.reference, row.goal
        );
    }
    println!();
    for nginx in [plain, tuned] {
        println!(
            "{}: {:.0} requests/s = {:.2} × direct",
            nginx.name,
            nginx.requests_per_second(),
            nginx.requests_per_second() / dr
        );
    }
    if !noise.is_empty() {
        println!(
            "note: {}; below {NOISE_US:.0} µs the latency ratios are mostly noise: compare the \
             absolute µs",
            noise.join(", ")
        );
    }
    println!("swap A: {}", swap.command_a);
    println!("swap B: {}", swap.command_b);
    let list = |v: &[Swap]| v.iter().map(|s| format!("{:.1}", ms(s.total))).collect::<Vec<_>>();
    println!(
        "swap ms, each round: hangar → B {:?}, → A {:?}; by hand → B {:?}, → A {:?}",
        list(&swap.hangar[0]),
        list(&swap.hangar[1]),
        list(&swap.raw[0]),
        list(&swap.raw[1])
    );
    for (name, swaps) in [("hangar", &swap.hangar), ("by hand", &swap.raw)] {
        println!("swap phases, {name}: {}", phases(swaps.iter().flatten()));
    }
}

/// Medians of a swap's phases: old engine stopped, new one spawned, new one ready.
pub(super) fn phases<'a>(swaps: impl Iterator<Item = &'a Swap>) -> String {
    let (mut stop, mut spawn, mut ready) = (Vec::new(), Vec::new(), Vec::new());
    for s in swaps {
        if let (Some(stopped), Some(spawned)) = (s.stopped, s.spawned) {
            stop.push(stopped);
            spawn.push(spawned.saturating_sub(stopped));
            ready.push(s.total.saturating_sub(spawned));
        }
    }
    if stop.is_empty() {
        return "not found".to_owned();
    }
    format!(
        "medians of {}: begin → old engine exited {:.1} ms, → new engine spawned +{:.1} ms, → \
         ready +{:.1} ms",
        stop.len(),
        ms(median(&mut stop)),
        ms(median(&mut spawn)),
        ms(median(&mut ready))
    )
}
