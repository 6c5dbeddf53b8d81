//! Early builds: a build starts at a burst's leading edge and its result is used only if the
//! burst settled with no change after that edge. Unit cases, then a property test over random
//! bursts and build ends.

use proptest::prelude::*;

use super::testing::*;
use super::*;

/// A session serving the build `a` (warm, no host needed).
fn serving() -> Harness {
    let mut h = Harness::ungated(|c| c.warm = true);
    h.build(complete("a"));
    assert!(h.current_epoch().is_some());
    h
}

fn latest_exe(h: &Harness) -> Option<String> {
    h.s.build
        .latest
        .as_ref()
        .map(|r| r.executable.sha256.clone())
}

fn settle(h: &mut Harness, changed_after_leading_edge: bool) {
    h.handle(Event::SourcesChanged {
        paths: vec!["src/main.rs".into()],
        changed_after_leading_edge,
    });
    h.serve();
}

fn changing(h: &mut Harness) {
    h.handle(Event::SourcesChanging);
    h.serve();
}

#[test]
fn an_early_build_starts_at_the_leading_edge_and_is_used_once_the_burst_settles() {
    let mut h = serving();
    let started = h.io().builds_started;
    changing(&mut h);
    assert_eq!(h.io().builds_started, started + 1, "built at once");
    // Done before the quiet period ended: held, not used yet.
    h.build(complete("b"));
    assert_eq!(latest_exe(&h).as_deref(), Some("sha256:a"));
    settle(&mut h, false);
    assert_eq!(latest_exe(&h).as_deref(), Some("sha256:b"));
    assert_eq!(h.io().builds_started, started + 1, "and not built twice");
}

#[test]
fn an_early_build_that_settles_while_running_is_an_ordinary_build() {
    let mut h = serving();
    changing(&mut h);
    settle(&mut h, false);
    let started = h.io().builds_started;
    h.build(complete("b"));
    assert_eq!(latest_exe(&h).as_deref(), Some("sha256:b"));
    assert_eq!(h.io().builds_started, started);
}

#[test]
fn a_change_after_the_leading_edge_sets_the_early_build_aside() {
    for held in [false, true] {
        let mut h = serving();
        changing(&mut h);
        let started = h.io().builds_started;
        if held {
            h.build(complete("mid-save"));
        }
        settle(&mut h, true);
        if !held {
            h.build(complete("mid-save"));
        }
        assert_eq!(
            latest_exe(&h).as_deref(),
            Some("sha256:a"),
            "a build that may have read a half-saved file is never used (held: {held})"
        );
        assert_eq!(
            h.io().builds_started,
            started + 1,
            "the settled files are built"
        );
        assert_eq!(h.io().builds_set_aside, 1, "what it recorded is undone");
        h.build(complete("c"));
        assert_eq!(latest_exe(&h).as_deref(), Some("sha256:c"));
    }
}

#[test]
fn a_burst_during_an_ordinary_build_still_queues_one_follow_up() {
    let mut h = serving();
    settle(&mut h, false); // no leading edge seen: an ordinary build
    let started = h.io().builds_started;
    changing(&mut h); // a build runs: nothing starts early
    assert_eq!(h.io().builds_started, started);
    settle(&mut h, false);
    h.build(complete("b"));
    assert_eq!(h.io().builds_started, started + 1, "one follow-up");
    h.build(complete("c"));
    assert_eq!(latest_exe(&h).as_deref(), Some("sha256:c"));
}

#[test]
fn a_session_that_stops_during_an_early_build_uses_nothing() {
    let mut h = serving();
    changing(&mut h);
    h.handle(Event::Shutdown("signal".into()));
    h.serve();
    h.build(complete("b"));
    settle(&mut h, false);
    assert_eq!(latest_exe(&h).as_deref(), Some("sha256:a"));
}

#[derive(Debug, Clone)]
enum Step {
    /// A burst begins (the watcher's leading edge), if none is open.
    Change,
    /// The open burst settles; `true`: a change came after its leading edge.
    Settle(bool),
    /// The oldest outstanding build ends (ok or failed).
    Finish(bool),
}

fn step() -> impl Strategy<Value = Step> {
    prop_oneof![
        Just(Step::Change),
        any::<bool>().prop_map(Step::Settle),
        any::<bool>().prop_map(Step::Finish),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]
    /// Over random bursts and build ends: builds never overlap; an early build whose burst saw
    /// a change after the leading edge is never used; and once the last burst settles and every
    /// build ends, the build in use is the last one started (it saw the settled sources), with
    /// nothing left running or held.
    #[test]
    fn early_builds_never_serve_unsettled_code(steps in prop::collection::vec(step(), 1..40)) {
        let mut h = serving();
        let base = h.io().builds_started;
        // The exe each build started will produce ("b<n>"), in start order.
        let mut started = 0usize;
        let mut finished = 0usize;
        let mut last_ok = false;
        // The open burst, and the build its leading edge started (if one started).
        let mut burst: Option<Option<usize>> = None;
        let mut stale: Vec<String> = Vec::new();
        let mut used: Vec<String> = Vec::new();
        let note = |h: &mut Harness, used: &mut Vec<String>| {
            if let Some(exe) = latest_exe(h) && used.last() != Some(&exe) {
                used.push(exe);
            }
        };
        let end_burst = |h: &mut Harness, burst: Option<usize>, late: bool, stale: &mut Vec<String>| {
            if late && let Some(n) = burst {
                stale.push(format!("sha256:b{n}"));
            }
            settle(h, late);
        };
        for step in steps {
            match step {
                Step::Change => if burst.is_none() {
                    changing(&mut h);
                    let now = h.io().builds_started - base;
                    burst = Some((now > started).then_some(started));
                },
                Step::Settle(late) => if let Some(b) = burst.take() {
                    end_burst(&mut h, b, late, &mut stale);
                },
                Step::Finish(ok) => if finished < started {
                    h.build(if ok { complete(&format!("b{finished}")) } else { failed(None) });
                    finished += 1;
                    last_ok = ok;
                },
            }
            started = h.io().builds_started - base;
            prop_assert!(started <= finished + 1, "builds overlap: {} started, {} ended", started, finished);
            note(&mut h, &mut used);
        }
        // Quiesce: the open burst settles (with no late change), then every build ends well.
        if let Some(b) = burst.take() {
            end_burst(&mut h, b, false, &mut stale);
        }
        for _ in 0..10 {
            started = h.io().builds_started - base;
            if finished == started {
                break;
            }
            h.build(complete(&format!("b{finished}")));
            finished += 1;
            last_ok = true;
            note(&mut h, &mut used);
        }
        prop_assert_eq!(finished, h.io().builds_started - base, "builds kept starting");
        prop_assert_eq!(h.s.build.runs, Builds::Idle);
        prop_assert!(h.s.build.early.is_none());
        for exe in &used {
            prop_assert!(!stale.contains(exe), "{} was used though its burst changed after it began", exe);
        }
        // The last build ended well: it is what runs (a failed last build leaves the one before).
        if finished > 0 && last_ok {
            prop_assert_eq!(latest_exe(&h), Some(format!("sha256:b{}", finished - 1)));
        }
    }
}

/// Review of issue 15: an early build set aside while a *second* burst is open (its leading edge came
/// while the early build ran, so nothing started then) is rebuilt at once, mid-burst, as an
/// ordinary build; if that rebuild ends before the burst settles it is served at once, though
/// it may have read a file of the open burst mid-save (the very case early builds set aside).
#[test]
fn a_set_aside_rebuild_during_an_open_burst_is_not_served_before_it_settles() {
    let mut h = serving();
    changing(&mut h); // burst 1: early build E starts
    settle(&mut h, true); // a change came after its edge: E will be set aside
    changing(&mut h); // burst 2 begins while E runs (nothing starts)
    let started = h.io().builds_started;
    h.build(complete("e")); // E ends: set aside, rebuilt now, while burst 2 is open
    assert_eq!(h.io().builds_set_aside, 1);
    assert_eq!(h.io().builds_started, started + 1);
    h.build(complete("mid-burst-2")); // the rebuild ends before burst 2 settles
    assert_eq!(
        latest_exe(&h).as_deref(),
        Some("sha256:a"),
        "a build started inside an open burst is served before the burst settled"
    );
}
