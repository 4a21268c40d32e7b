//! [`Coalesced`]: a future whose own wake-ups, made while it is being polled, become another
//! round of polling instead of a reschedule.
//!
//! A task that drives several parts of one exchange — hyper's server connection and the
//! request body it hands the handler, or a client connection and the answer's body — has
//! those parts wake each other: reading a body asks the connection for more, the connection
//! hands the body its bytes. Polled by one task, each such wake-up wakes that same task while
//! it runs. tokio's multi-threaded scheduler treats that as a yield, and a yield wakes a
//! parked worker thread to come and take the task over: on a forwarded request, a futex call
//! and a context switch of a thread that finds nothing to do. [`Coalesced`] polls its future
//! with a waker of its own: a wake-up during the poll asks for one more round (at most
//! four), one outside a poll (a socket became ready) wakes the task as usual.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};

/// Not being polled: a wake-up wakes the task.
const IDLE: u8 = 0;
/// Being polled: a wake-up asks for another round.
const POLLING: u8 = 1;
/// Being polled, and woken since the round began.
const WOKEN: u8 = 2;
/// Rounds of one poll before a wake-up goes to the task after all: tokio's cooperative
/// budget makes a task that must yield wake itself, and that wake-up must reach the
/// scheduler.
const ROUNDS: usize = 4;

/// `future`, polled with [`Coalesced`]'s waker (see the module documentation).
pub struct Coalesced<F> {
    future: Pin<Box<F>>,
    state: Arc<State>,
    waker: Waker,
}

impl<F: Future> Coalesced<F> {
    /// Wraps `future`.
    pub fn new(future: F) -> Self {
        let state = Arc::new(State::default());
        let waker = Waker::from(Arc::clone(&state));
        Self { future: Box::pin(future), state, waker }
    }
}

impl<F: Future> Future for Coalesced<F> {
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.get_mut();
        this.state.remember(cx.waker());
        let mut inner = Context::from_waker(&this.waker);
        for _ in 0..ROUNDS {
            this.state.phase.store(POLLING, Ordering::SeqCst);
            let out = this.future.as_mut().poll(&mut inner);
            // Back to idle, unless a wake-up came during the round.
            let woken = this
                .state
                .phase
                .compare_exchange(POLLING, IDLE, Ordering::SeqCst, Ordering::SeqCst)
                .is_err();
            if out.is_ready() || !woken {
                this.state.phase.store(IDLE, Ordering::SeqCst);
                return out;
            }
        }
        this.state.phase.store(IDLE, Ordering::SeqCst);
        cx.waker().wake_by_ref();
        Poll::Pending
    }
}

/// What the waker shares with the future.
#[derive(Default)]
struct State {
    /// [`IDLE`], [`POLLING`] or [`WOKEN`].
    phase: AtomicU8,
    /// The task's own waker, from its latest poll.
    task: Mutex<Option<Waker>>,
}

impl State {
    fn remember(&self, waker: &Waker) {
        let mut task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
        if !task.as_ref().is_some_and(|t| t.will_wake(waker)) {
            *task = Some(waker.clone());
        }
    }
}

impl Wake for State {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        match self.phase.compare_exchange(POLLING, WOKEN, Ordering::SeqCst, Ordering::SeqCst) {
            Ok(_) | Err(WOKEN) => {}
            Err(_) => {
                let task = self.task.lock().unwrap_or_else(PoisonError::into_inner);
                if let Some(task) = task.as_ref() {
                    task.wake_by_ref();
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize};
    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    /// Counts the wake-ups that reach the task.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Wakes itself `wakes` times during its polls, then completes with the polls it took.
    struct SelfWaking {
        wakes: usize,
        polls: usize,
    }

    impl Future for SelfWaking {
        type Output = usize;
        fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<usize> {
            self.polls += 1;
            if self.wakes == 0 {
                return Poll::Ready(self.polls);
            }
            self.wakes -= 1;
            cx.waker().wake_by_ref();
            Poll::Pending
        }
    }

    fn poll_once<F: Future>(future: &mut Coalesced<F>, task: &Arc<Count>) -> Poll<F::Output> {
        let waker = Waker::from(Arc::clone(task));
        Pin::new(future).poll(&mut Context::from_waker(&waker))
    }

    #[test]
    fn wake_ups_during_a_poll_become_rounds_of_the_same_poll() {
        let task = Arc::new(Count::default());
        let mut future = Coalesced::new(SelfWaking { wakes: ROUNDS - 1, polls: 0 });
        assert_eq!(poll_once(&mut future, &task), Poll::Ready(ROUNDS));
        assert_eq!(task.0.load(Ordering::SeqCst), 0, "no wake-up reached the task");
    }

    #[test]
    fn a_future_that_keeps_waking_itself_yields_to_the_scheduler_after_the_rounds() {
        let task = Arc::new(Count::default());
        let mut future = Coalesced::new(SelfWaking { wakes: ROUNDS + 1, polls: 0 });
        assert_eq!(poll_once(&mut future, &task), Poll::Pending);
        assert_eq!(task.0.load(Ordering::SeqCst), 1, "the task is woken to poll again");
        assert_eq!(poll_once(&mut future, &task), Poll::Ready(ROUNDS + 2));
    }

    #[test]
    fn a_wake_up_after_the_poll_reaches_the_task() {
        let task = Arc::new(Count::default());
        let stored: Arc<Mutex<Option<Waker>>> = Arc::default();
        let keep = Arc::clone(&stored);
        let mut future = Coalesced::new(std::future::poll_fn(move |cx| {
            *keep.lock().unwrap() = Some(cx.waker().clone());
            Poll::<()>::Pending
        }));
        assert_eq!(poll_once(&mut future, &task), Poll::Pending);
        assert_eq!(task.0.load(Ordering::SeqCst), 0);
        stored.lock().unwrap().take().unwrap().wake();
        assert_eq!(task.0.load(Ordering::SeqCst), 1);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Invariant: no wake-up is lost. Another thread sets a flag and then wakes the
        /// future's registered waker, at a random moment — before, during or after a poll,
        /// while the future also wakes itself a random number of times. Each poll lasts a
        /// random while after it has looked at the flag (the window where a wake-up can
        /// land mid-poll). The future completes once it sees the flag; it must always see
        /// it, so the task completes.
        #[test]
        fn no_wake_up_from_another_thread_is_lost(
            delays in proptest::collection::vec(0u64..300, 1..8),
            self_wakes in 0usize..6,
            busy_us in 0u64..100,
        ) {
            let runtime = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_time()
                .build()
                .unwrap();
            runtime.block_on(async {
                for delay in delays {
                    let flag = Arc::new(AtomicBool::new(false));
                    let waker: Arc<Mutex<Option<Waker>>> = Arc::default();
                    let (seen, slot) = (Arc::clone(&flag), Arc::clone(&waker));
                    let mut own = self_wakes;
                    let future = Coalesced::new(std::future::poll_fn(move |cx| {
                        *slot.lock().unwrap() = Some(cx.waker().clone());
                        if seen.load(Ordering::SeqCst) {
                            return Poll::Ready(());
                        }
                        let start = std::time::Instant::now();
                        while start.elapsed() < Duration::from_micros(busy_us) {
                            std::hint::spin_loop();
                        }
                        if own > 0 {
                            own -= 1;
                            cx.waker().wake_by_ref();
                        }
                        Poll::Pending
                    }));
                    let task = tokio::spawn(future);
                    std::thread::spawn(move || {
                        std::thread::sleep(Duration::from_micros(delay));
                        flag.store(true, Ordering::SeqCst);
                        if let Some(waker) = waker.lock().unwrap().take() {
                            waker.wake();
                        }
                    });
                    let done = tokio::time::timeout(Duration::from_secs(5), task).await;
                    prop_assert!(done.is_ok(), "a wake-up was lost (delay {delay} µs)");
                }
                Ok(())
            })?;
        }
    }
}
