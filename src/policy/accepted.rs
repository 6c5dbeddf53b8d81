//! The accepted policy: what a human confirmed for a package, and how it meets the policy the
//! project asks for. Owns: the policy's gating terms as data ([`Terms`]), their meet (the
//! stricter of two, per tool), the weakenings a request holds over what was accepted (in plain
//! words), and the accepted-policy record's format and seal. Must not touch: I/O (the record
//! is read and written by `face::commands::policy_record`), the clock.
//!
//! The rule: the project's policy (`[package.metadata.mcp-dev]` and `run`'s flags, both files
//! the agent can edit) strengthens gating at once and weakens it only once a human accepted the
//! weakening (`cargo mcp-dev approve --policy`). The effective policy is [`meet`]: a tool is
//! gated if either side gates it, and needs a decision per call if either side says so. With no
//! record, what is accepted is the default (`gate = "all"`, per epoch, nothing exempt).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use super::approval::{ApprovalMode, Gating, Policy};
use crate::audit::chain::AuditKey;

/// Which tools need a grant, as data.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub enum GateTerms {
    /// Nothing is gated.
    Off,
    /// Every tool but these.
    All { exempt: BTreeSet<String> },
    /// Only these tools.
    Only { tools: BTreeSet<String> },
}

/// The gating part of a policy: what [`meet`] orders. Credential scopes are not in it (they
/// name what a grant covers, not whether one is needed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Terms {
    pub gate: GateTerms,
    /// `approval = "per-call"`: every gated tool needs a decision per call.
    pub per_call_all: bool,
    /// Tools that need a decision per call.
    pub per_call: BTreeSet<String>,
}

impl Default for Terms {
    /// What is accepted when nothing was: the default policy (every tool gated, per epoch).
    fn default() -> Terms {
        Terms::of(&Policy::default())
    }
}

impl Terms {
    /// Terms that gate nothing: the meet with them is the other side as it is.
    pub fn nothing_gated() -> Terms {
        Terms {
            gate: GateTerms::Off,
            ..Terms::default()
        }
    }

    pub fn of(policy: &Policy) -> Terms {
        Terms {
            gate: match &policy.gating {
                Gating::Off => GateTerms::Off,
                Gating::All { exempt } => GateTerms::All {
                    exempt: exempt.clone(),
                },
                Gating::Only(tools) => GateTerms::Only {
                    tools: tools.clone(),
                },
            },
            per_call_all: policy.mode == ApprovalMode::PerCall,
            per_call: policy.per_call_tools.clone(),
        }
    }

    /// `policy` with these terms in place of its gating and modes (its credential scopes kept).
    pub fn apply_to(&self, policy: &mut Policy) {
        policy.gating = match &self.gate {
            // Per-call tools are gated even so (see [`Terms::gates`]).
            GateTerms::Off if !self.per_call.is_empty() => Gating::Only(self.per_call.clone()),
            GateTerms::Off => Gating::Off,
            GateTerms::All { exempt } => Gating::All {
                exempt: exempt.clone(),
            },
            GateTerms::Only { tools } => Gating::Only(tools.clone()),
        };
        policy.mode = if self.per_call_all {
            ApprovalMode::PerCall
        } else {
            ApprovalMode::PerEpoch
        };
        policy.per_call_tools = self.per_call.clone();
    }

    /// Whether `tool` needs a grant (a per-call tool always does, as `run` settles it).
    pub fn gates(&self, tool: &str) -> bool {
        self.per_call.contains(tool)
            || match &self.gate {
                GateTerms::Off => false,
                GateTerms::All { exempt } => !exempt.contains(tool),
                GateTerms::Only { tools } => tools.contains(tool),
            }
    }

    /// Whether a grant for `tool` covers one call only.
    pub fn per_call_for(&self, tool: &str) -> bool {
        self.per_call_all || self.per_call.contains(tool)
    }

    /// The tools these terms name (with a name no tool has, standing for every other tool):
    /// two terms that agree on each of them agree on every tool.
    fn named(&self) -> BTreeSet<String> {
        let mut names: BTreeSet<String> = self.per_call.clone();
        match &self.gate {
            GateTerms::Off => {}
            GateTerms::All { exempt } => names.extend(exempt.iter().cloned()),
            GateTerms::Only { tools } => names.extend(tools.iter().cloned()),
        }
        names.insert(String::from("\u{0}any other tool"));
        names
    }

    /// Whether these terms are at least as strict as `other` for every tool.
    pub fn at_least_as_strict_as(&self, other: &Terms) -> bool {
        let names: BTreeSet<String> = self.named().union(&other.named()).cloned().collect();
        names.iter().all(|t| {
            (self.gates(t) || !other.gates(t)) && (self.per_call_for(t) || !other.per_call_for(t))
        })
    }
}

/// The stricter of `a` and `b`, per tool: gated where either gates, per call where either says.
pub fn meet(a: &Terms, b: &Terms) -> Terms {
    use GateTerms::*;
    let gate = match (&a.gate, &b.gate) {
        (Off, x) | (x, Off) => x.clone(),
        (All { exempt: e1 }, All { exempt: e2 }) => All {
            exempt: e1.intersection(e2).cloned().collect(),
        },
        (All { exempt }, Only { tools }) | (Only { tools }, All { exempt }) => All {
            exempt: exempt.difference(tools).cloned().collect(),
        },
        (Only { tools: t1 }, Only { tools: t2 }) => Only {
            tools: t1.union(t2).cloned().collect(),
        },
    };
    Terms {
        gate,
        per_call_all: a.per_call_all || b.per_call_all,
        per_call: a.per_call.union(&b.per_call).cloned().collect(),
    }
}

/// One way a requested policy is weaker than the accepted one.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub enum Weakening {
    /// `gate = "off"` (or `--no-gating`) where something is gated.
    GateOff,
    /// `gate = [..]` where every tool is gated: tools outside the list would need nothing.
    OnlyListed,
    /// This tool would need no grant (a new `exempt` entry, or dropped from a `gate` list).
    Ungated(String),
    /// `approval = "per-epoch"` where every call needed a decision.
    PerEpoch,
    /// This tool would no longer need a decision per call.
    NotPerCall(String),
}

impl Weakening {
    /// What the request does, in plain words (after "Cargo.toml " or "the host's flags ").
    /// Tool names are the project's: the caller sanitizes the sentence before showing it.
    pub fn words(&self) -> String {
        match self {
            Weakening::GateOff => "turn the gate off".into(),
            Weakening::OnlyListed => {
                "gate only the tools in `gate = [..]` (every other tool would need no approval)"
                    .into()
            }
            Weakening::Ungated(t) => format!("exempt `{t}` from approval"),
            Weakening::PerEpoch => {
                "ask once per epoch instead of for every call (`approval = \"per-epoch\"`)".into()
            }
            Weakening::NotPerCall(t) => {
                format!("let one approval of `{t}` cover the whole epoch (it needs one per call)")
            }
        }
    }

    /// Stable short form for the audit record and `status --json`.
    pub fn code(&self) -> String {
        match self {
            Weakening::GateOff => "gate-off".into(),
            Weakening::OnlyListed => "only-listed".into(),
            Weakening::Ungated(t) => format!("exempt:{t}"),
            Weakening::PerEpoch => "per-epoch".into(),
            Weakening::NotPerCall(t) => format!("not-per-call:{t}"),
        }
    }
}

/// The ways `requested` is weaker than `accepted` (empty: `requested` applies as it is).
pub fn weakenings(requested: &Terms, accepted: &Terms) -> Vec<Weakening> {
    let mut out = Vec::new();
    // Tools gated by the accepted terms and not by the request (the name no tool has standing
    // for every other tool).
    let names: BTreeSet<String> = requested
        .named()
        .union(&accepted.named())
        .cloned()
        .collect();
    let lost: Vec<&String> = names
        .iter()
        .filter(|t| accepted.gates(t) && !requested.gates(t))
        .collect();
    if !lost.is_empty() && requested.gate == GateTerms::Off {
        out.push(Weakening::GateOff);
    } else {
        for t in lost {
            out.push(if t.starts_with('\u{0}') {
                Weakening::OnlyListed
            } else {
                Weakening::Ungated(t.clone())
            });
        }
    }
    if accepted.per_call_all && !requested.per_call_all {
        out.push(Weakening::PerEpoch);
    }
    for t in accepted.per_call.difference(&requested.per_call) {
        if !requested.per_call_all {
            out.push(Weakening::NotPerCall(t.clone()));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Version of the record format.
pub const RECORD_VERSION: u32 = 1;

/// Domain tag of the record's MAC (no record or anchor MAC starts with it).
const MAC_DOMAIN: &[u8] = b"cargo-mcp-dev accepted-policy v1\0";

/// What a human accepted for one package: kept in the user's state directory, sealed with the
/// user's audit key so a file written without the key is refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct AcceptedRecord {
    pub version: u32,
    /// The package's manifest (canonical path): the record is for this package only.
    pub manifest: String,
    pub terms: Terms,
    /// Milliseconds since the Unix epoch.
    pub accepted_at_ms: u64,
    /// Whether the acceptance is in the audit log yet (a live `run` held the log: the next
    /// `run` records it).
    pub logged: bool,
    pub mac: String,
}

/// Why a record on disk is not taken (every case is treated as nothing accepted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordError {
    NotARecord(String),
    Version(u32),
    OtherPackage(String),
    BadSeal,
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::NotARecord(e) => write!(f, "not an accepted-policy record ({e})"),
            RecordError::Version(v) => write!(f, "unknown record version {v}"),
            RecordError::OtherPackage(m) => {
                write!(f, "it is the record of another package ({m})")
            }
            RecordError::BadSeal => f.write_str(
                "its seal does not match this user's audit key (written by something else, or edited)",
            ),
        }
    }
}

impl AcceptedRecord {
    /// A record of `terms` for `manifest`, sealed with `key`.
    pub fn sealed(
        manifest: &str,
        terms: Terms,
        accepted_at_ms: u64,
        logged: bool,
        key: &AuditKey,
    ) -> AcceptedRecord {
        let mut r = AcceptedRecord {
            version: RECORD_VERSION,
            manifest: manifest.to_string(),
            terms,
            accepted_at_ms,
            logged,
            mac: String::new(),
        };
        r.mac = r.expected_mac(key);
        r
    }

    fn expected_mac(&self, key: &AuditKey) -> String {
        let mut unsealed = serde_json::to_value(self).unwrap_or_default();
        if let Some(map) = unsealed.as_object_mut() {
            map.remove("mac");
        }
        let mut message = MAC_DOMAIN.to_vec();
        if crate::audit::canonical_json(&unsealed, &mut message).is_err() {
            return String::new();
        }
        crate::audit::chain::keyed_digest(key, &message)
    }

    /// The record in `bytes` if it is one, for `manifest`, sealed with `key`.
    pub fn open(
        bytes: &[u8],
        manifest: &str,
        key: &AuditKey,
    ) -> Result<AcceptedRecord, RecordError> {
        let r: AcceptedRecord =
            serde_json::from_slice(bytes).map_err(|e| RecordError::NotARecord(e.to_string()))?;
        if r.version != RECORD_VERSION {
            return Err(RecordError::Version(r.version));
        }
        let expected = r.expected_mac(key);
        if expected.is_empty()
            || !crate::base::hashing::same_secret_text(expected.as_bytes(), r.mac.as_bytes())
        {
            return Err(RecordError::BadSeal);
        }
        if r.manifest != manifest {
            return Err(RecordError::OtherPackage(r.manifest));
        }
        Ok(r)
    }

    /// The file's bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = serde_json::to_vec_pretty(self).unwrap_or_default();
        out.push(b'\n');
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }
    fn all(exempt: &[&str]) -> Terms {
        Terms {
            gate: GateTerms::All {
                exempt: set(exempt),
            },
            per_call_all: false,
            per_call: BTreeSet::new(),
        }
    }
    fn only(tools: &[&str]) -> Terms {
        Terms {
            gate: GateTerms::Only { tools: set(tools) },
            ..all(&[])
        }
    }
    fn off() -> Terms {
        Terms {
            gate: GateTerms::Off,
            ..all(&[])
        }
    }

    #[test]
    fn the_default_is_every_tool_gated_per_epoch() {
        let d = Terms::default();
        assert_eq!(d, all(&[]));
        assert!(d.gates("anything") && !d.per_call_for("anything"));
    }

    #[test]
    fn each_kind_of_weakening_is_named_and_held_back() {
        let acc = Terms::default();
        // gate -> off
        assert_eq!(weakenings(&off(), &acc), [Weakening::GateOff]);
        assert_eq!(meet(&off(), &acc), acc);
        // a new exempt entry
        assert_eq!(
            weakenings(&all(&["list"]), &acc),
            [Weakening::Ungated("list".into())]
        );
        assert!(meet(&all(&["list"]), &acc).gates("list"));
        // all -> a list
        assert_eq!(weakenings(&only(&["write"]), &acc), [Weakening::OnlyListed]);
        assert!(meet(&only(&["write"]), &acc).gates("read"));
        // a list loses a tool
        assert_eq!(
            weakenings(&only(&["a"]), &only(&["a", "b"])),
            [Weakening::Ungated("b".into())]
        );
        // per-call -> per-epoch, globally and for one tool
        let strict = Terms {
            per_call_all: true,
            ..all(&[])
        };
        assert_eq!(weakenings(&acc, &strict), [Weakening::PerEpoch]);
        assert!(meet(&acc, &strict).per_call_for("x"));
        let one = Terms {
            per_call: set(&["delete"]),
            ..all(&[])
        };
        assert_eq!(
            weakenings(&acc, &one),
            [Weakening::NotPerCall("delete".into())]
        );
        assert!(meet(&acc, &one).per_call_for("delete"));
        // An exemption the human accepted stays accepted.
        assert!(weakenings(&all(&["list"]), &all(&["list", "read"])).is_empty());
        for w in [
            Weakening::GateOff,
            Weakening::OnlyListed,
            Weakening::Ungated("t".into()),
            Weakening::PerEpoch,
            Weakening::NotPerCall("t".into()),
        ] {
            assert!(!w.words().is_empty() && !w.code().is_empty());
        }
    }

    #[test]
    fn each_kind_of_strengthening_applies_at_once() {
        // off -> all, a removed exemption, a tool newly gated, moved to per-call
        for (req, acc) in [
            (all(&[]), off()),
            (all(&["a"]), all(&["a", "b"])),
            (only(&["a", "b"]), only(&["a"])),
            (all(&[]), only(&["a"])),
            (
                Terms {
                    per_call: set(&["d"]),
                    ..all(&[])
                },
                all(&[]),
            ),
            (
                Terms {
                    per_call_all: true,
                    ..all(&[])
                },
                all(&[]),
            ),
        ] {
            assert!(weakenings(&req, &acc).is_empty(), "{req:?} over {acc:?}");
            let eff = meet(&req, &acc);
            assert!(
                eff.at_least_as_strict_as(&req) && req.at_least_as_strict_as(&eff),
                "{req:?} over {acc:?} gave {eff:?}"
            );
        }
    }

    #[test]
    fn mixed_requests_take_the_strict_half_and_hold_the_weak_half() {
        // `b` newly gated (strengthening), `c` newly exempt (weakening), per-call dropped.
        let acc = Terms {
            per_call: set(&["d"]),
            ..all(&["b"])
        };
        let req = all(&["c", "d"]);
        let w = weakenings(&req, &acc);
        assert_eq!(
            w,
            [
                Weakening::Ungated("c".into()),
                Weakening::Ungated("d".into()),
                Weakening::NotPerCall("d".into())
            ]
        );
        let eff = meet(&req, &acc);
        assert!(eff.gates("b"), "the strengthening applies");
        assert!(eff.gates("c"), "the weakening waits");
        assert!(eff.gates("d") && eff.per_call_for("d"));
        assert!(!eff.per_call_for("b"));
    }

    fn key() -> AuditKey {
        AuditKey::from_bytes([7; 32])
    }

    #[test]
    fn records_round_trip_and_a_planted_or_edited_one_is_refused() {
        let r = AcceptedRecord::sealed("/p/Cargo.toml", off(), 5, true, &key());
        let bytes = r.to_bytes();
        assert_eq!(
            AcceptedRecord::open(&bytes, "/p/Cargo.toml", &key()),
            Ok(r.clone())
        );
        // Another key (planted by someone without this user's key).
        assert_eq!(
            AcceptedRecord::open(&bytes, "/p/Cargo.toml", &AuditKey::from_bytes([8; 32])),
            Err(RecordError::BadSeal)
        );
        // Edited terms.
        let text = String::from_utf8(bytes.clone()).unwrap();
        let edited = text.replace("\"off\"", "{\"all\":{\"exempt\":[]}}");
        assert_ne!(edited, text);
        assert_eq!(
            AcceptedRecord::open(edited.as_bytes(), "/p/Cargo.toml", &key()),
            Err(RecordError::BadSeal)
        );
        // Another package's record copied over.
        assert!(matches!(
            AcceptedRecord::open(&bytes, "/q/Cargo.toml", &key()),
            Err(RecordError::OtherPackage(_))
        ));
        // Garbage, an unknown field, an empty seal.
        assert!(matches!(
            AcceptedRecord::open(b"\x00garbage", "/p/Cargo.toml", &key()),
            Err(RecordError::NotARecord(_))
        ));
        let extra = text.replacen('{', "{\"gateOff\":true,", 1);
        assert!(matches!(
            AcceptedRecord::open(extra.as_bytes(), "/p/Cargo.toml", &key()),
            Err(RecordError::NotARecord(_))
        ));
        let mut unsealed = r;
        unsealed.mac = String::new();
        assert_eq!(
            AcceptedRecord::open(&unsealed.to_bytes(), "/p/Cargo.toml", &key()),
            Err(RecordError::BadSeal)
        );
    }

    const TOOLS: &[&str] = &["a", "b", "c", "d"];

    fn names() -> impl Strategy<Value = BTreeSet<String>> {
        proptest::sample::subsequence(TOOLS, 0..=TOOLS.len())
            .prop_map(|v| v.into_iter().map(str::to_string).collect())
    }

    fn terms() -> impl Strategy<Value = Terms> {
        let gate = prop_oneof![
            Just(GateTerms::Off),
            names().prop_map(|exempt| GateTerms::All { exempt }),
            names().prop_map(|tools| GateTerms::Only { tools }),
        ];
        (gate, any::<bool>(), names()).prop_map(|(gate, per_call_all, per_call)| Terms {
            gate,
            per_call_all,
            per_call,
        })
    }

    proptest! {
        /// The effective policy is never weaker than either side, for any tool.
        #[test]
        fn effective_is_never_weaker_than_either_side(req in terms(), acc in terms()) {
            let eff = meet(&req, &acc);
            for t in TOOLS.iter().copied().chain(["unnamed"]) {
                prop_assert!(eff.gates(t) || (!req.gates(t) && !acc.gates(t)), "{t}");
                prop_assert!(eff.per_call_for(t) || (!req.per_call_for(t) && !acc.per_call_for(t)));
                // ... and never stricter than both: a tool neither side gates is not gated.
                prop_assert!(!eff.gates(t) || req.gates(t) || acc.gates(t), "{t}");
            }
            prop_assert!(eff.at_least_as_strict_as(&req) && eff.at_least_as_strict_as(&acc));
            prop_assert_eq!(meet(&acc, &req).at_least_as_strict_as(&eff), true);
        }

        /// Nothing waits exactly when the request applies as it is.
        #[test]
        fn weakenings_are_listed_exactly_when_the_request_is_held_back(req in terms(), acc in terms()) {
            let w = weakenings(&req, &acc);
            let eff = meet(&req, &acc);
            let applies = req.at_least_as_strict_as(&eff);
            prop_assert_eq!(w.is_empty(), applies, "{:?}", w);
            prop_assert_eq!(w.is_empty(), req.at_least_as_strict_as(&acc));
        }
    }
}
