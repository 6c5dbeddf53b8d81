//! The routing table: where one host request goes, given the state of the current server.
//!
//! Owns: the decision forward / hold / answer / answer from the record, for every request the
//! supervisor does not answer by itself (`initialize`, `ping` and stream limits are answered
//! before the table is asked). The same table is asked when a request arrives, when held
//! requests are looked at again after every transition, and when a held request's deadline
//! passes, so the three can never drift apart (issue 34: "forward while fetching?" was decided
//! in two places that disagreed). Pure: no session, no I/O; the session computes the inputs and
//! acts on the answer.
//!
//! Must not touch: gating (a forwarded call goes to the router, which asks the gate), the
//! wording of answers (the rooms that give them), I/O.

use std::time::Duration;

use super::state::{ChildPhase, Listed, Tools};

/// What the table needs to know of the current server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServerView {
    /// No server process runs (one may be on its way: that is in [`Budgets::hold`]).
    Absent,
    /// Started; our handshake is not sent yet (the host's era is not known).
    Started,
    /// Our handshake is in flight, to be answered by `due_ms`.
    Handshaking { due_ms: u64 },
    /// Legacy: past our handshake, waiting for the host's `notifications/initialized`.
    AwaitingInitialized,
    /// Our `tools/list` is in flight; `of`: what the server had said about its tools.
    Fetching { of: Listed },
    /// Up, no fetch in flight (its tools known, or its first list failed).
    Ready,
}

impl ServerView {
    pub fn of(phase: Option<&ChildPhase>) -> ServerView {
        match phase {
            None => ServerView::Absent,
            Some(ChildPhase::Started) => ServerView::Started,
            Some(ChildPhase::Handshaking { due_ms }) => ServerView::Handshaking { due_ms: *due_ms },
            Some(ChildPhase::AwaitingInitialized) => ServerView::AwaitingInitialized,
            Some(ChildPhase::Up(Tools::Fetching(f))) => ServerView::Fetching { of: f.of },
            Some(ChildPhase::Up(Tools::Known(_) | Tools::Unknown { .. })) => ServerView::Ready,
        }
    }

    fn is_up(self) -> bool {
        matches!(self, ServerView::Fetching { .. } | ServerView::Ready)
    }
}

/// The requests the table tells apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// `tools/call`: judged by the gate against the current catalog.
    Call,
    /// `tools/list`; `paged`: asked with a cursor (never answered from a whole record).
    List { paged: bool },
    /// `server/discover`, the modern host's probe.
    Discover,
    /// `subscriptions/listen` (opens a stream at the server).
    Listen,
    /// Anything else: the server answers it itself.
    Other,
}

impl Class {
    pub fn of(method: Option<&str>, has_cursor: impl FnOnce() -> bool) -> Class {
        match method {
            Some("tools/call") => Class::Call,
            Some("tools/list") => Class::List {
                paged: has_cursor(),
            },
            Some("server/discover") => Class::Discover,
            Some("subscriptions/listen") => Class::Listen,
            _ => Class::Other,
        }
    }
}

/// When the table is asked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    /// The request just arrived.
    Arrived,
    /// It is held, and the server's state just changed.
    Released,
    /// It is held, and its deadline passed at `now_ms`. `record_lists`: a catalog is recorded
    /// that no server of this session ran newer code than (the table adds: and no server runs).
    Expired { now_ms: u64, record_lists: bool },
}

/// How long a request may wait in the current state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// How long a request may wait for a server that is coming, if one is (`None`: none is,
    /// or the session is closing).
    pub hold: Option<Duration>,
    /// How long a `server/discover` probe waits for a real server's answer.
    pub discover: Duration,
}

/// What becomes of the request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Route {
    /// To the server now (a call goes to the router, which asks the gate).
    Forward,
    /// Held for at most this long (only when it arrives).
    Hold(Duration),
    /// Stays held as it is.
    KeepHolding,
    /// Its deadline passed, but the server of this session owes its handshake answer by
    /// `due_ms`: it waits for that, never for a record.
    WaitForServer { due_ms: u64 },
    /// Answered now by the supervisor (a call: judged now, and refused without a server).
    Answer(Answer),
    /// A whole list answered from the recorded catalog (a real server of this package said
    /// it; the first-start budget ran out).
    FromRecord,
}

/// Which answer the supervisor gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// No server will answer soon: why (build broken, crash loop, closing, none running).
    Unavailable,
    /// It waited its whole budget for a server that is still not up.
    Expired,
    /// The probe is told to use `initialize`.
    UseInitialize,
}

/// Whether a request goes to a server whose tools are being fetched: everything but a call
/// (judged by the catalog being fetched), a probe and a stream (a server mid-fetch has
/// answered its handshake; they wait for it to be ready), and a host's first list of a server
/// that never listed (first contact answers it with the catalog this fetch brings).
fn served_during_fetch(class: Class, of: Listed) -> bool {
    match class {
        Class::Call | Class::Discover | Class::Listen => false,
        Class::List { .. } => of != Listed::Nothing,
        Class::Other => true,
    }
}

/// Whether the request goes to the server now, in any moment.
fn forwarded(server: ServerView, class: Class) -> bool {
    match server {
        ServerView::Ready => true,
        ServerView::Fetching { of } => served_during_fetch(class, of),
        _ => false,
    }
}

/// The table.
pub fn route(server: ServerView, class: Class, moment: Moment, budgets: Budgets) -> Route {
    if forwarded(server, class) {
        return Route::Forward;
    }
    match moment {
        Moment::Arrived => match (class, budgets.hold) {
            // A real server's answer within the probe wait, else a fallback to `initialize`
            // before the host gives up on its probe (a late answer to a probe the host
            // abandoned drops the connection: issue 33).
            (Class::Discover, Some(_)) => Route::Hold(budgets.discover),
            (Class::Discover, None) => Route::Answer(Answer::UseInitialize),
            (_, Some(wait)) => Route::Hold(wait),
            (_, None) => Route::Answer(Answer::Unavailable),
        },
        Moment::Released => Route::KeepHolding,
        Moment::Expired {
            now_ms,
            record_lists,
        } => match (server, class) {
            // A server of this session is up and owes its answer by a deadline of its own:
            // held requests wait for it, never for a record (a probe is answered: the host
            // gives up on it soon).
            (ServerView::Handshaking { due_ms }, class)
                if due_ms > now_ms && class != Class::Discover =>
            {
                Route::WaitForServer { due_ms }
            }
            // The record is a whole list: never the answer to a page asked for by cursor, nor
            // while a server of this session runs (it answers for itself).
            (ServerView::Absent, Class::List { paged: false }) if record_lists => Route::FromRecord,
            // A server of this session is up and lists its tools: it answers this one too.
            (server, Class::List { .. }) if server.is_up() => Route::Forward,
            (_, Class::Discover) => Route::Answer(Answer::UseInitialize),
            _ => Route::Answer(Answer::Expired),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn listed() -> impl Strategy<Value = Listed> {
        prop_oneof![
            Just(Listed::Nothing),
            proptest::option::of(0u64..100).prop_map(|asked_ms| Listed::Unknown { asked_ms }),
            Just(Listed::Known(super::super::state::Extent::Listed)),
            Just(Listed::Known(super::super::state::Extent::CutAtBound)),
        ]
    }

    fn server() -> impl Strategy<Value = ServerView> {
        prop_oneof![
            Just(ServerView::Absent),
            Just(ServerView::Started),
            (0u64..200).prop_map(|due_ms| ServerView::Handshaking { due_ms }),
            Just(ServerView::AwaitingInitialized),
            listed().prop_map(|of| ServerView::Fetching { of }),
            Just(ServerView::Ready),
        ]
    }

    fn class() -> impl Strategy<Value = Class> {
        prop_oneof![
            Just(Class::Call),
            any::<bool>().prop_map(|paged| Class::List { paged }),
            Just(Class::Discover),
            Just(Class::Listen),
            Just(Class::Other),
        ]
    }

    fn moment() -> impl Strategy<Value = Moment> {
        prop_oneof![
            Just(Moment::Arrived),
            Just(Moment::Released),
            (0u64..200, any::<bool>()).prop_map(|(now_ms, record_lists)| Moment::Expired {
                now_ms,
                record_lists
            }),
        ]
    }

    fn budgets() -> impl Strategy<Value = Budgets> {
        (proptest::option::of(0u64..30_000), 0u64..5_000).prop_map(|(hold, discover)| Budgets {
            hold: hold.map(Duration::from_millis),
            discover: Duration::from_millis(discover),
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4096))]

        /// Arrival, release and expiry agree on what goes to the server: a request is
        /// forwarded when it arrives exactly when a held one is released in the same state
        /// (the class of bug that had two routing decisions drift apart).
        #[test]
        fn arrival_and_release_forward_alike(s in server(), c in class(), b in budgets()) {
            let arrived = route(s, c, Moment::Arrived, b) == Route::Forward;
            let released = route(s, c, Moment::Released, b) == Route::Forward;
            prop_assert_eq!(arrived, released);
        }

        /// Nothing is forwarded to a server that has not answered its handshake, and a call
        /// reaches the router with a server only once the server is ready (a fetch in flight
        /// decides the catalog it is judged by).
        #[test]
        fn forwarding_needs_a_server_past_its_handshake(
            s in server(), c in class(), m in moment(), b in budgets()
        ) {
            if route(s, c, m, b) == Route::Forward {
                prop_assert!(s.is_up(), "{s:?} {c:?} {m:?}");
                if matches!(c, Class::Call | Class::Discover | Class::Listen) {
                    prop_assert_eq!(s, ServerView::Ready);
                }
            }
        }

        /// A host's first list of a server that never listed is never passed to it while the
        /// supervisor's own fetch is in flight (it is answered with that fetch's catalog).
        #[test]
        fn a_first_list_waits_for_the_first_fetch(paged in any::<bool>(), b in budgets()) {
            let s = ServerView::Fetching { of: Listed::Nothing };
            for m in [Moment::Arrived, Moment::Released] {
                prop_assert_ne!(route(s, Class::List { paged }, m, b), Route::Forward);
            }
        }

        /// Requests wait only for a server that is coming, and only as long as allowed: a
        /// probe at most the discover wait, everything else at most the hold budget.
        #[test]
        fn holds_are_bounded_by_the_budget(s in server(), c in class(), b in budgets()) {
            match route(s, c, Moment::Arrived, b) {
                Route::Hold(w) => {
                    prop_assert!(b.hold.is_some());
                    if c == Class::Discover {
                        prop_assert_eq!(w, b.discover);
                    } else {
                        prop_assert_eq!(Some(w), b.hold);
                    }
                }
                Route::Forward | Route::Answer(_) => {}
                other => prop_assert!(false, "on arrival: {other:?}"),
            }
        }

        /// A state change never answers a held request (only its deadline does), and a
        /// deadline never leaves it held without a later deadline of the server's.
        #[test]
        fn release_holds_and_expiry_answers(
            s in server(), c in class(), b in budgets(), now_ms in 0u64..200, rec in any::<bool>()
        ) {
            let released = route(s, c, Moment::Released, b);
            prop_assert!(matches!(released, Route::Forward | Route::KeepHolding));
            let expired = route(s, c, Moment::Expired { now_ms, record_lists: rec }, b);
            match expired {
                Route::KeepHolding | Route::Hold(_) => prop_assert!(false, "{expired:?}"),
                Route::WaitForServer { due_ms } => prop_assert!(due_ms > now_ms),
                _ => {}
            }
        }

        /// The record answers only a whole list, only at its deadline, only when allowed, and
        /// never while this session's server can answer it.
        #[test]
        fn the_record_answers_only_an_expired_whole_list(
            s in server(), c in class(), m in moment(), b in budgets()
        ) {
            if route(s, c, m, b) == Route::FromRecord {
                prop_assert_eq!(c, Class::List { paged: false });
                prop_assert!(
                    matches!(m, Moment::Expired { record_lists: true, .. }),
                    "at {:?}", m
                );
                prop_assert!(!s.is_up());
            }
        }
    }

    /// The table as a newcomer reads it (docs/ARCHITECTURE.md): a rebuild's gap (no server,
    /// one coming), a new server's first fetch, and a ready server.
    #[test]
    fn tools_list_during_a_rebuild() {
        let b = Budgets {
            hold: Some(Duration::from_secs(5)),
            discover: Duration::from_secs(1),
        };
        let list = Class::List { paged: false };
        assert_eq!(
            route(ServerView::Absent, list, Moment::Arrived, b),
            Route::Hold(Duration::from_secs(5))
        );
        let first = ServerView::Fetching {
            of: Listed::Nothing,
        };
        assert_eq!(route(first, list, Moment::Released, b), Route::KeepHolding);
        let refresh = ServerView::Fetching {
            of: Listed::Known(super::super::state::Extent::Listed),
        };
        assert_eq!(route(refresh, list, Moment::Arrived, b), Route::Forward);
        assert_eq!(
            route(ServerView::Ready, list, Moment::Released, b),
            Route::Forward
        );
        let closing = Budgets { hold: None, ..b };
        assert_eq!(
            route(ServerView::Absent, list, Moment::Arrived, closing),
            Route::Answer(Answer::Unavailable)
        );
    }
}
