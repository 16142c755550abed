//! One watcher of a cloud's preemption notices for every command that runs on spot: it
//! polls a [`NoticeSource`] on a task of its own, so a long poll (GCP's) never holds up the
//! command, says what stands now, and sends acknowledgements back as they are asked for.

use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot, watch};

use crate::notice::{Action, Notice, NoticeSource};

/// An acknowledgement to send, and who waits for it to have gone out.
type Ack = (Notice, Option<oneshot::Sender<()>>);

/// The notice that stands, kept current by a polling task; the task ends once the watcher
/// and every receiver it gave out are dropped.
#[derive(Debug)]
pub struct NoticeWatcher {
    current: watch::Receiver<Option<Notice>>,
    acks: mpsc::UnboundedSender<Ack>,
}

impl NoticeWatcher {
    /// Polls `source` every `poll` (a long poll counts towards it) on a task of the current
    /// tokio runtime. A read that fails is said once, then every 60th time, and once it
    /// answers again.
    pub fn spawn<S: NoticeSource + 'static>(mut source: S, poll: Duration) -> NoticeWatcher {
        let (tx, current) = watch::channel(None);
        let (acks, mut ack_rx) = mpsc::unbounded_channel::<Ack>();
        tokio::spawn(async move {
            let mut failing = 0u32;
            loop {
                let started = Instant::now();
                match source.check().await {
                    Ok(notice) => {
                        if failing > 0 {
                            tracing::info!("{} metadata answers again", source.cloud());
                        }
                        failing = 0;
                        tx.send_if_modified(|cur: &mut Option<Notice>| {
                            let key =
                                |n: &Option<Notice>| n.as_ref().map(|n| (n.action, n.deadline));
                            let changed = key(cur) != key(&notice);
                            *cur = notice;
                            changed
                        });
                    }
                    Err(e) => {
                        failing += 1;
                        if failing == 1 || failing.is_multiple_of(60) {
                            tracing::warn!(
                                "cannot read the {} preemption notice: {e}",
                                source.cloud()
                            );
                        }
                    }
                }
                if tx.is_closed() {
                    return;
                }
                // Acknowledgements go out as they are asked for, not at the next poll: the
                // platform may go on as soon as it has one.
                let pause = tokio::time::sleep(poll.saturating_sub(started.elapsed()));
                tokio::pin!(pause);
                loop {
                    tokio::select! {
                        () = &mut pause => break,
                        Some((n, sent)) = ack_rx.recv() => {
                            if let Err(e) = source.acknowledge(&n).await {
                                tracing::warn!(
                                    "cannot acknowledge the {} notice: {e}",
                                    source.cloud()
                                );
                            }
                            if let Some(sent) = sent {
                                let _ = sent.send(());
                            }
                        }
                    }
                }
            }
        });
        NoticeWatcher { current, acks }
    }

    /// The notice standing now (`None` while there is none); `changed()` wakes at each new
    /// one, and when it clears.
    pub fn subscribe(&self) -> watch::Receiver<Option<Notice>> {
        self.current.clone()
    }

    /// Tells the platform we are ready for `notice` (Azure proceeds early; a no-op
    /// elsewhere).
    pub fn acknowledge(&self, notice: Notice) {
        let _ = self.acks.send((notice, None));
    }

    /// [`acknowledge`](Self::acknowledge), then waits until the acknowledgement has gone out
    /// (or failed), at most until `until`: a process about to exit must not drop it.
    pub async fn acknowledge_before(&self, notice: Notice, until: Instant) {
        let (sent, gone) = oneshot::channel();
        if self.acks.send((notice, Some(sent))).is_ok() {
            let _ = tokio::time::timeout_at(until.into(), gone).await;
        }
    }

    /// The first notice of any kind, acknowledged at once; never, when the watcher's task has
    /// ended.
    pub async fn first(&self) -> Notice {
        let mut rx = self.subscribe();
        let notice = match rx.wait_for(Option::is_some).await {
            Ok(n) => n.clone(),
            Err(_) => None,
        };
        match notice {
            Some(notice) => {
                self.acknowledge(notice.clone());
                notice
            }
            None => std::future::pending().await,
        }
    }

    /// Whether no termination notice stands by `until`: `true` at once when none does, or
    /// as soon as it is withdrawn; `false` when it still stands at `until` (or the task has
    /// ended with it standing). The wait never outlasts `until`, so it cannot hold a process
    /// past a notice's deadline.
    pub async fn withdrawn_by(&self, until: Instant) -> bool {
        let mut rx = self.subscribe();
        let standing =
            |n: &Option<Notice>| n.as_ref().is_some_and(|n| n.action == Action::Terminate);
        let withdrawn = rx.wait_for(|n| !standing(n));
        matches!(
            tokio::time::timeout_at(until.into(), withdrawn).await,
            Ok(Ok(_))
        )
    }
}

/// What a watcher says as it changes, for a `select!` loop: nothing ever without a watcher.
#[derive(Debug)]
pub struct Changes(Option<watch::Receiver<Option<Notice>>>);

impl Changes {
    pub fn of(watcher: Option<&NoticeWatcher>) -> Changes {
        Changes(watcher.map(NoticeWatcher::subscribe))
    }

    /// The next change: the notice that stands now, `None` when it cleared. Pending forever
    /// without a watcher or once its task has ended; safe to cancel.
    pub async fn next(&mut self) -> Option<Notice> {
        if let Some(rx) = &mut self.0
            && rx.changed().await.is_ok()
        {
            return rx.borrow_and_update().clone();
        }
        std::future::pending().await
    }
}

#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::{Arc, Mutex};
    use std::time::SystemTime;

    use crate::notice::{Cloud, NoticeError};

    /// A source that says what the test sets, and counts acknowledgements.
    #[derive(Clone, Default)]
    struct Scripted {
        notice: Arc<Mutex<Option<Notice>>>,
        acked: Arc<Mutex<Vec<Notice>>>,
        fail: Arc<Mutex<bool>>,
    }

    impl NoticeSource for Scripted {
        fn cloud(&self) -> Cloud {
            Cloud::Azure
        }

        async fn check(&mut self) -> Result<Option<Notice>, NoticeError> {
            if *self.fail.lock().unwrap() {
                return Err(NoticeError::UnknownCloud("down".into()));
            }
            Ok(self.notice.lock().unwrap().clone())
        }

        async fn acknowledge(&mut self, notice: &Notice) -> Result<(), NoticeError> {
            self.acked.lock().unwrap().push(notice.clone());
            Ok(())
        }
    }

    fn notice(action: Action) -> Notice {
        Notice {
            cloud: Cloud::Azure,
            action,
            deadline: SystemTime::now() + Duration::from_secs(30),
            detail: "Preempt".into(),
            event_id: Some("E-1".into()),
        }
    }

    const POLL: Duration = Duration::from_millis(20);

    #[tokio::test]
    async fn the_first_notice_is_seen_and_acknowledged_at_once() {
        let source = Scripted::default();
        *source.notice.lock().unwrap() = Some(notice(Action::Rebalance));
        // A long pause between polls: the acknowledgement must not wait for the next one.
        let watcher = NoticeWatcher::spawn(source.clone(), Duration::from_secs(30));
        let first = tokio::time::timeout(Duration::from_secs(5), watcher.first())
            .await
            .unwrap();
        assert_eq!(first.action, Action::Rebalance);
        let acked = tokio::time::timeout(Duration::from_secs(5), async {
            while source.acked.lock().unwrap().is_empty() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
        .await;
        assert!(acked.is_ok(), "acknowledged");
        assert_eq!(source.acked.lock().unwrap()[0], first);
    }

    #[tokio::test]
    async fn an_acknowledgement_waited_for_has_gone_out_when_the_wait_returns() {
        let source = Scripted::default();
        *source.notice.lock().unwrap() = Some(notice(Action::Terminate));
        let watcher = NoticeWatcher::spawn(source.clone(), Duration::from_secs(30));
        let first = tokio::time::timeout(Duration::from_secs(5), watcher.first())
            .await
            .unwrap();
        // In order after the one `first` sent, however long the pause between polls.
        watcher
            .acknowledge_before(first.clone(), Instant::now() + Duration::from_secs(5))
            .await;
        assert_eq!(*source.acked.lock().unwrap(), vec![first.clone(), first]);
    }

    #[tokio::test]
    async fn a_termination_notice_stands_until_it_clears() {
        let source = Scripted::default();
        *source.fail.lock().unwrap() = true;
        let watcher = NoticeWatcher::spawn(source.clone(), POLL);
        let mut changes = Changes::of(Some(&watcher));
        // No notice while the source fails, nor while there is none: cleared at once.
        tokio::time::sleep(POLL * 3).await;
        assert!(watcher.subscribe().borrow().is_none());
        assert!(watcher.withdrawn_by(Instant::now()).await, "none stands");

        *source.fail.lock().unwrap() = false;
        *source.notice.lock().unwrap() = Some(notice(Action::Terminate));
        let seen = tokio::time::timeout(Duration::from_secs(5), changes.next()).await;
        assert_eq!(seen.unwrap().map(|n| n.action), Some(Action::Terminate));
        // A standing notice is not withdrawn: the wait ends at its bound, no later.
        let looked = Instant::now();
        assert!(!watcher.withdrawn_by(looked + POLL * 3).await, "it stands");
        assert!(
            looked.elapsed() < Duration::from_secs(5),
            "{:?}",
            looked.elapsed()
        );
        let cleared = tokio::spawn(async move {
            watcher
                .withdrawn_by(Instant::now() + Duration::from_secs(30))
                .await
        });
        tokio::time::sleep(POLL * 3).await;
        assert!(!cleared.is_finished(), "the notice stands");
        *source.notice.lock().unwrap() = None;
        let withdrawn = tokio::time::timeout(Duration::from_secs(5), cleared)
            .await
            .unwrap()
            .unwrap();
        assert!(withdrawn, "withdrawn before the bound");
        assert_eq!(changes.next().await, None, "cleared");

        // Without a watcher, nothing ever changes.
        let mut none = Changes::of(None);
        assert!(tokio::time::timeout(POLL, none.next()).await.is_err());
    }
}
