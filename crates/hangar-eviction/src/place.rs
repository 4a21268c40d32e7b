//! GPUs as separate places: [`plan_placement`] picks which GPU(s) a load goes to and which
//! models to evict there, from each GPU's own free memory.
//!
//! The pooled rule ([`plan_load_within`](crate::plan_load_within)) sums every GPU's budget,
//! so a 20 GB model is admitted on two 16 GB cards with 12 GB free on each and then fails
//! with out of memory, and a victim frees memory on whichever GPU it happens to use. Here
//! each GPU is a place of its own:
//!
//! - **What a load needs.** A model takes `needed_mib` on one GPU, or an even share
//!   (`needed_mib / split`, rounded up) on each of `split` GPUs (a tensor split), chosen from
//!   the GPUs it may use ([`Fit::allowed`]; empty: any).
//! - **Victims per GPU.** The slot and device victims of [`plan_load`] go first (their memory
//!   comes back wherever it is). Then, GPU by GPU of a candidate placement, models holding
//!   memory on that GPU are evicted until its share fits: never a held model, idle ones
//!   first, least recently used first, then busy ones. A split victim frees its memory on
//!   every GPU it holds, which counts for the GPUs checked after it.
//! - **The rule.** Of the placements that fit, the one with the fewest evictions wins, then
//!   the one whose victims were used least recently (the latest last use among them is the
//!   oldest), then the one that leaves the most free memory on its GPUs, then the lowest
//!   indices.
//! - **Refusal before eviction.** When no placement fits, even with every evictable model
//!   gone from every allowed GPU, the plan evicts nothing and says, per allowed GPU, what
//!   its share lacks ([`Refusal`]): a load that cannot happen never costs another model its
//!   place (the evict-and-reload loop of a model that can never fit).

use std::cmp::Ordering;

use hangar_config::{MaxLoadedModels, ModelName};

use crate::plan::{EvictionPlan, EvictionReason, Incoming, LoadedModel, Victim, VramShortfall};
use crate::policy::plan_load;

/// One GPU as a placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuRoom {
    /// The GPU's index, in PCI bus order as NVML reports it.
    pub index: u32,
    /// Its budget minus the memory in use on it now, in MiB (negative when over budget).
    pub free_mib: i64,
}

/// Memory a loaded model holds on one GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuHolding {
    /// The model.
    pub model: ModelName,
    /// The GPU.
    pub gpu: u32,
    /// What it holds there, in MiB.
    pub mib: u64,
}

/// What the incoming model needs and where it may go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fit {
    /// What it is expected to take over all its GPUs, in MiB.
    pub needed_mib: u64,
    /// The GPUs it may use; empty: any.
    pub allowed: Vec<u32>,
    /// How many GPUs it spreads over at once (1: one GPU; N: a tensor split, an even share
    /// on each). 0 reads as 1.
    pub split: u32,
}

impl Refusal {
    /// The refusal as one shortfall: the GPU that comes closest (least missing, then most
    /// free) gives the summary figures, and every allowed GPU its own side. `needed_mib` is
    /// what the model takes on each of its GPUs.
    pub fn shortfall(&self, fit: &Fit) -> VramShortfall {
        match self {
            Self::TooFewGpus { split, .. } => VramShortfall {
                needed_mib: fit.share_mib(),
                free_mib: 0,
                missing_mib: fit.share_mib().max(1),
                holders: Vec::new(),
                gpus: Vec::new(),
                gpus_needed: *split,
            },
            Self::NoRoom(gpus) => {
                let closest = gpus.iter().min_by(|a, b| {
                    a.missing_mib.cmp(&b.missing_mib).then_with(|| b.free_mib.cmp(&a.free_mib))
                });
                VramShortfall {
                    needed_mib: fit.share_mib(),
                    free_mib: closest.map_or(0, |g| g.free_mib),
                    missing_mib: closest.map_or(fit.share_mib(), |g| g.missing_mib.max(1)),
                    holders: closest.map(|g| g.holders.clone()).unwrap_or_default(),
                    gpus: gpus.clone(),
                    gpus_needed: fit.gpus(),
                }
            }
        }
    }
}

impl Fit {
    /// How many GPUs the model takes at once (at least one).
    pub fn gpus(&self) -> u32 {
        self.split.max(1)
    }

    /// What it takes on each of its GPUs, in MiB: the figure divided by the split, rounded
    /// up.
    pub fn share_mib(&self) -> u64 {
        self.needed_mib.div_ceil(u64::from(self.gpus()))
    }
}

/// A placement and what must be unloaded before the load goes there.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Placed {
    /// Slot and device victims, then the victims that make room on the chosen GPUs
    /// ([`EvictionReason::VramBudget`]); `blocked_by` as [`plan_load`] says. Empty victims
    /// when refused.
    pub plan: EvictionPlan,
    /// The chosen GPUs, ascending; empty when refused, blocked or already loaded.
    pub gpus: Vec<u32>,
    /// Set when no placement fits: nothing is evicted.
    pub refusal: Option<Refusal>,
}

/// Why no placement fits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The model spreads over more GPUs than it may use.
    TooFewGpus {
        /// GPUs it may use (and that exist).
        allowed: Vec<u32>,
        /// GPUs it needs at once.
        split: u32,
    },
    /// No set of allowed GPUs has room for its shares, even after every evictable model on
    /// them is gone.
    NoRoom(Vec<GpuShortfall>),
}

/// One allowed GPU's side of a [`Refusal::NoRoom`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShortfall {
    /// The GPU.
    pub gpu: u32,
    /// What the model would take on it, in MiB.
    pub share_mib: u64,
    /// Its free memory now, with the slot and device victims gone, in MiB.
    pub free_mib: i64,
    /// What is still missing there after evicting every model that may be evicted, in MiB
    /// (0: this GPU alone would have room; the placement needs more such GPUs).
    pub missing_mib: u64,
    /// Models holding memory on it, largest first, with whether they are held.
    pub holders: Vec<(ModelName, u64, bool)>,
}

/// Plans the load of `incoming` onto GPUs: [`plan_load`]'s slot and device victims, then a
/// placement by the rule of this module, evicting only on the GPUs that need room.
///
/// `gpus` are the GPUs that exist with what is free on each; `holdings` what each loaded
/// model holds on each GPU. A model already loaded, or a load blocked by held models, is
/// answered as [`plan_load`] answers it, with no placement.
pub fn plan_placement(
    loaded: &[LoadedModel],
    incoming: &Incoming,
    limits: &MaxLoadedModels,
    gpus: &[GpuRoom],
    holdings: &[GpuHolding],
    fit: &Fit,
) -> Placed {
    let base = plan_load(loaded, incoming, limits);
    if base.is_blocked() || loaded.iter().any(|m| m.name == incoming.name) {
        return Placed { plan: base, ..Placed::default() };
    }
    place(loaded, base, &incoming.name, gpus, holdings, fit)
}

/// Plans new runtimes of `model`, loaded and serving meanwhile, beside its own (a reload, a
/// weight update): no slot is needed, only room on GPUs by the rule of this module; `model`
/// itself is never a victim, and what it holds stays counted.
pub fn plan_second_copy_placed(
    loaded: &[LoadedModel],
    model: &ModelName,
    gpus: &[GpuRoom],
    holdings: &[GpuHolding],
    fit: &Fit,
) -> Placed {
    place(loaded, EvictionPlan::default(), model, gpus, holdings, fit)
}

/// Places `model` after the `base` victims: the rule of this module.
fn place(
    loaded: &[LoadedModel],
    base: EvictionPlan,
    model: &ModelName,
    gpus: &[GpuRoom],
    holdings: &[GpuHolding],
    fit: &Fit,
) -> Placed {
    let mut allowed: Vec<GpuRoom> = gpus
        .iter()
        .filter(|g| fit.allowed.is_empty() || fit.allowed.contains(&g.index))
        .copied()
        .collect();
    allowed.sort_by_key(|g| g.index);
    allowed.dedup_by_key(|g| g.index);
    let split = fit.gpus();
    if allowed.len() < split as usize {
        let allowed = allowed.iter().map(|g| g.index).collect();
        return Placed {
            refusal: Some(Refusal::TooFewGpus { allowed, split }),
            ..Placed::default()
        };
    }
    let rooms = Rooms::new(loaded, &base, model, &allowed, holdings);
    let share = fit.share_mib();
    let mut best: Option<(Vec<u32>, Vec<&LoadedModel>, i128)> = None;
    let newest = |victims: &[&LoadedModel]| victims.iter().map(|m| m.last_use).max();
    for set in combinations(allowed.len(), split as usize) {
        let chosen: Vec<u32> = set.iter().map(|&i| allowed[i].index).collect();
        let Some((victims, left)) = rooms.make_room(&chosen, share) else { continue };
        let better = best.as_ref().is_none_or(|(_, v, l)| {
            let order = victims
                .len()
                .cmp(&v.len())
                .then_with(|| newest(&victims).cmp(&newest(v)))
                .then_with(|| left.cmp(l).reverse());
            order == Ordering::Less
        });
        if better {
            best = Some((chosen, victims, left));
        }
    }
    let Some((chosen, victims, _)) = best else {
        let refusal = Refusal::NoRoom(rooms.shortfalls(share));
        return Placed { refusal: Some(refusal), ..Placed::default() };
    };
    let mut plan = base;
    plan.victims.extend(victims.into_iter().map(|m| Victim::of(m, EvictionReason::VramBudget)));
    Placed { plan, gpus: chosen, refusal: None }
}

/// The allowed GPUs' free memory once the slot and device victims are gone, and who may be
/// evicted from them.
struct Rooms<'a> {
    /// (GPU, free MiB) for each allowed GPU, ascending.
    free: Vec<(u32, i128)>,
    /// Models that may be evicted for memory: not held, not already victims, idle first,
    /// least recently used first.
    candidates: Vec<&'a LoadedModel>,
    loaded: &'a [LoadedModel],
    holdings: &'a [GpuHolding],
}

impl<'a> Rooms<'a> {
    fn new(
        loaded: &'a [LoadedModel],
        base: &EvictionPlan,
        model: &ModelName,
        allowed: &[GpuRoom],
        holdings: &'a [GpuHolding],
    ) -> Self {
        let mut rooms = Self { free: Vec::new(), candidates: Vec::new(), loaded, holdings };
        rooms.free = allowed
            .iter()
            .map(|g| {
                let freed: i128 = base.names().map(|n| i128::from(rooms.holding(n, g.index))).sum();
                (g.index, i128::from(g.free_mib) + freed)
            })
            .collect();
        let mut candidates: Vec<&LoadedModel> = loaded
            .iter()
            .filter(|m| !m.held && m.name != *model && !base.contains(m.name.as_str()))
            .collect();
        candidates.sort_by(|a, b| {
            (!a.is_idle(), a.last_use, &a.name).cmp(&(!b.is_idle(), b.last_use, &b.name))
        });
        rooms.candidates = candidates;
        rooms
    }

    /// What `model` holds on `gpu`, in MiB.
    fn holding(&self, model: &ModelName, gpu: u32) -> u64 {
        self.holdings.iter().filter(|h| h.model == *model && h.gpu == gpu).map(|h| h.mib).sum()
    }

    fn free_on(&self, gpu: u32) -> i128 {
        self.free.iter().find(|(g, _)| *g == gpu).map_or(0, |(_, f)| *f)
    }

    /// The victims that give each GPU of `chosen` room for `share`, GPU by GPU, and the free
    /// memory they leave on `chosen` after the load; `None` when some GPU cannot get room.
    fn make_room(&self, chosen: &[u32], share: u64) -> Option<(Vec<&'a LoadedModel>, i128)> {
        let share = i128::from(share);
        let mut free: Vec<i128> = chosen.iter().map(|&g| self.free_on(g)).collect();
        let mut victims: Vec<&LoadedModel> = Vec::new();
        for at in 0..chosen.len() {
            let gpu = chosen[at];
            let mut next = self.candidates.iter().filter(|m| self.holding(&m.name, gpu) > 0);
            while free[at] < share {
                let m = loop {
                    let m = next.next()?;
                    if !victims.iter().any(|v| v.name == m.name) {
                        break m;
                    }
                };
                for (i, &g) in chosen.iter().enumerate() {
                    free[i] += i128::from(self.holding(&m.name, g));
                }
                victims.push(m);
            }
        }
        Some((victims, free.iter().map(|f| f - share).sum()))
    }

    /// Each allowed GPU's shortfall for `share`, with every evictable model gone.
    fn shortfalls(&self, share: u64) -> Vec<GpuShortfall> {
        self.free
            .iter()
            .map(|&(gpu, free)| {
                let evictable: i128 =
                    self.candidates.iter().map(|m| i128::from(self.holding(&m.name, gpu))).sum();
                let missing = i128::from(share) - free - evictable;
                let mut holders: Vec<(ModelName, u64, bool)> = self
                    .loaded
                    .iter()
                    .map(|m| (m.name.clone(), self.holding(&m.name, gpu), m.held))
                    .filter(|(_, mib, _)| *mib > 0)
                    .collect();
                holders.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
                GpuShortfall {
                    gpu,
                    share_mib: share,
                    free_mib: i64::try_from(free).unwrap_or(i64::MIN),
                    missing_mib: u64::try_from(missing.max(0)).unwrap_or(u64::MAX),
                    holders,
                }
            })
            .collect()
    }
}

/// Every `k`-element subset of `0..n`, each ascending, in lexicographic order.
fn combinations(n: usize, k: usize) -> Vec<Vec<usize>> {
    fn go(start: usize, n: usize, k: usize, cur: &mut Vec<usize>, out: &mut Vec<Vec<usize>>) {
        if cur.len() == k {
            out.push(cur.clone());
            return;
        }
        for i in start..n {
            cur.push(i);
            go(i + 1, n, k, cur, out);
            cur.pop();
        }
    }
    let mut out = Vec::new();
    go(0, n, k, &mut Vec::new(), &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::combinations;

    #[test]
    fn combinations_are_every_subset_once_in_order() {
        assert_eq!(combinations(3, 2), [vec![0, 1], vec![0, 2], vec![1, 2]]);
        assert_eq!(combinations(4, 4), [vec![0, 1, 2, 3]]);
        assert_eq!(combinations(2, 3), Vec::<Vec<usize>>::new());
        assert_eq!(combinations(4, 1).len(), 4);
    }
}
