//! The activity journal (`audit show`) against ids the host reuses (red-team round 12: the test
//! failed on the code as found).

use serde_json::{Value, json};

use super::journal::{CallOutcome, Journals};
use super::{FORMAT_VERSION, GENESIS_PREV, Record};

fn rec(seq: u64, ty: &str, data: Value) -> Record {
    Record {
        v: FORMAT_VERSION,
        seq,
        time: format!("2025-06-01T12:00:{seq:02}.000Z"),
        record_type: ty.into(),
        run: "R".into(),
        epoch: Some("E".into()),
        prev: GENESIS_PREV.into(),
        data,
        hash: String::new(),
        mac: String::new(),
    }
}

/// The host reuses the id of a call that ran (id 5, `write_item`, answered) for a call of
/// another tool that the gate refuses. A refusal writes no `tool_called`, so the denial is
/// put on the newest entry with id 5: `audit show` lists `write_item` (which ran and
/// succeeded) as denied, and the refused `delete_all` call is nowhere. Round 11 matched a
/// late `tool_result` by tool; a denial (and a cancel) still goes to whatever call last had
/// the id, so a host can rewrite what the journal says about a call that ran.
#[test]
fn denial_reusing_an_id_does_not_rewrite_the_call_that_ran() {
    let records = vec![
        rec(1, "tool_called", json!({"callId": 5, "tool": "write_item"})),
        rec(
            2,
            "tool_result",
            json!({"callId": 5, "tool": "write_item", "isError": false, "durationMs": 3}),
        ),
        rec(
            3,
            "authorization_denied",
            json!({"callId": 5, "tool": "delete_all", "reason": "authorization_required"}),
        ),
    ];
    let j = Journals::from_records(&records);
    let got: Vec<_> = j
        .activity
        .iter()
        .map(|c| {
            (
                c.tool.as_str(),
                matches!(c.outcome, CallOutcome::Denied { .. }),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![("write_item", false), ("delete_all", true)],
        "{:?}",
        j.activity
    );
    assert_eq!(
        j.activity[0].outcome,
        CallOutcome::Ok {
            duration_ms: Some(3)
        }
    );
}
