//! The sealer, pure: records, the key and the chain's head in; sealed lines and the new head
//! out. No file, no clock, no environment: the time of a record is an argument (the writer reads
//! the clock or the event's [`Moment`](super::clock::Moment)), and the lines go into a buffer the
//! caller writes wherever it writes (see [`super::writer`] and [`super::sink`]).
//!
//! Owns: the order of a chain (seq = head seq + 1, `prev` = head hash, seq 1 after
//! [`GENESIS_PREV`]), the record's `time` text ([`RecordClock`]) and the scratch space sealing
//! reuses. The bytes of a line and what its hash and MAC cover are [`super::chain`]'s.
//! Must not touch: files, clocks, the writer's batch policy (when lines are written, rotation),
//! the anchor.
//!
//! The head is passed in and not moved by [`Sealer::seal`]: a record sealed onto a head that
//! will not be continued (the writer rotates before it would write it) is dropped by cutting
//! the buffer back, and sealed again onto the new head. [`Head::advance`] moves it.

use super::chain::{AuditKey, FORMAT_VERSION, GENESIS_PREV, Header, Hex64};
use super::clock::RecordClock;
use std::time::SystemTime;

/// The state of a chain a record continues: the newest record's `(seq, hash)`, or `None` for
/// an empty chain (the next record is seq 1 after [`GENESIS_PREV`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Head(Option<(u64, String)>);

impl Head {
    pub(crate) fn at(seq: u64, hash: String) -> Head {
        Head(Some((seq, hash)))
    }

    /// `(seq, hash)` of the newest record, `None` for an empty chain.
    pub(crate) fn get(&self) -> Option<(u64, &str)> {
        self.0.as_ref().map(|(s, h)| (*s, h.as_str()))
    }

    pub(crate) fn seq(&self) -> Option<u64> {
        self.0.as_ref().map(|(s, _)| *s)
    }

    /// Moves the head to the record just sealed (in place: no new string per record).
    pub(crate) fn advance(&mut self, seq: u64, hash: &str) {
        match &mut self.0 {
            Some((s, h)) => {
                *s = seq;
                h.clear();
                h.push_str(hash);
            }
            None => self.0 = Some((seq, hash.to_owned())),
        }
    }

    /// Becomes `other` (in place where both name a record).
    pub(crate) fn set_to(&mut self, other: &Head) {
        match (&mut self.0, &other.0) {
            (Some(w), Some(h)) => {
                w.0 = h.0;
                w.1.clone_from(&h.1);
            }
            (w, h) => *w = h.clone(),
        }
    }
}

/// Seals records for one key (see the module doc).
#[derive(Debug)]
pub(crate) struct Sealer {
    key: AuditKey,
    clock: RecordClock,
    /// Scratch space for the hashed body of the record being sealed.
    body: Vec<u8>,
}

impl Sealer {
    pub(crate) fn new(key: AuditKey) -> Sealer {
        Sealer {
            key,
            clock: RecordClock::default(),
            body: Vec::with_capacity(1 << 10),
        }
    }

    pub(crate) fn key(&self) -> &AuditKey {
        &self.key
    }

    /// Seals one record onto `head` and appends its line, with its `\n`, to `out`; returns the
    /// record's seq and hash (the new head, which the caller sets with [`Head::advance`]).
    /// `data` is the canonical encoding of the record's `data` ([`super::canonical_json`]).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn seal(
        &mut self,
        head: &Head,
        time: SystemTime,
        record_type: &str,
        run: &str,
        epoch: Option<&str>,
        data: &[u8],
        out: &mut Vec<u8>,
    ) -> (u64, Hex64) {
        let (seq, prev) = match head.get() {
            Some((seq, hash)) => (seq + 1, hash),
            None => (1, GENESIS_PREV),
        };
        let header = Header {
            v: FORMAT_VERSION,
            seq,
            time: self.clock.stamp(time),
            record_type,
            run,
            epoch,
            prev,
        };
        let (hash, _mac) = header.seal_into(&self.key, data, &mut self.body, out);
        out.push(b'\n');
        (seq, hash)
    }
}

#[cfg(test)]
mod tests {
    //! The sealer's lines are checked with the verifier's own line check
    //! ([`crate::audit::scan::check_line`], what `audit verify` and the writer's open run on
    //! every record), record after record, each expected to continue the one before; the chain
    //! must also end at the sealer's head (what the anchor holds: a dropped last record is found
    //! by it, not by the lines).
    use super::*;
    use crate::audit::chain::MacChecker;
    use crate::audit::scan::{self, Expect};
    use proptest::prelude::*;
    use std::time::{Duration, UNIX_EPOCH};

    /// One record to seal: type, run, epoch, a canonical `data`, and the time in ms.
    #[derive(Debug, Clone)]
    struct Input {
        record_type: String,
        run: String,
        epoch: Option<String>,
        data: Vec<u8>,
        ms: u64,
    }

    fn input() -> impl Strategy<Value = Input> {
        (
            "[a-z_]{1,12}",
            "[A-Z0-9]{1,8}",
            proptest::option::of("[A-Z0-9]{1,8}"),
            proptest::collection::vec(any::<i64>(), 0..4),
            "\\PC{0,12}",
            0u64..4_000_000_000_000,
        )
            .prop_map(|(record_type, run, epoch, numbers, text, ms)| {
                let mut data = Vec::new();
                crate::audit::canonical_json(
                    &serde_json::json!({"n": numbers, "t": text}),
                    &mut data,
                )
                .unwrap();
                Input {
                    record_type,
                    run,
                    epoch,
                    data,
                    ms,
                }
            })
    }

    fn key() -> AuditKey {
        AuditKey::from_bytes([7; 32])
    }

    /// Seals `inputs` onto `head` with `key`: the lines (each with its `\n`) and the new head.
    fn seal_all(key: &AuditKey, head: &Head, inputs: &[Input]) -> (Vec<Vec<u8>>, Head) {
        let mut sealer = Sealer::new(key.clone());
        let mut head = head.clone();
        let mut lines = Vec::new();
        for i in inputs {
            let mut out = Vec::new();
            let time = UNIX_EPOCH + Duration::from_millis(i.ms);
            let (seq, hash) = sealer.seal(
                &head,
                time,
                &i.record_type,
                &i.run,
                i.epoch.as_deref(),
                &i.data,
                &mut out,
            );
            head.advance(seq, hash.as_str());
            lines.push(out);
        }
        (lines, head)
    }

    /// Verifies a byte stream of lines as the continuation of `from`: every line checks and
    /// continues the one before, the stream ends in `\n`, and it ends at `head`.
    fn verifies(key: &AuditKey, from: &Head, bytes: &[u8], head: &Head) -> bool {
        let mac = MacChecker::new(key);
        let Some(body) = bytes.strip_suffix(b"\n") else {
            return bytes.is_empty() && from == head;
        };
        let mut expect = Expect {
            seq: Some(from.seq().unwrap_or(0) + 1),
            prev: Some(from.get().map_or(GENESIS_PREV, |(_, h)| h).to_string()),
        };
        let mut last = from.clone();
        for (n, raw) in body.split(|b| *b == b'\n').enumerate() {
            match scan::check_line(&mac, raw, true, n + 1, &expect, &mut Default::default()) {
                Ok(r) => {
                    expect = Expect {
                        seq: Some(r.seq + 1),
                        prev: Some(r.hash.clone()),
                    };
                    last = Head::at(r.seq, r.hash);
                }
                Err(_) => return false,
            }
        }
        &last == head
    }

    fn starting_heads() -> impl Strategy<Value = Head> {
        prop_oneof![
            Just(Head::default()),
            (1u64..1_000_000, "[0-9a-f]{64}").prop_map(|(s, h)| Head::at(s, h)),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn a_sealed_sequence_verifies_and_ends_at_the_head(
            from in starting_heads(),
            inputs in proptest::collection::vec(input(), 0..8),
        ) {
            let (lines, head) = seal_all(&key(), &from, &inputs);
            prop_assert_eq!(head.seq(), from.seq().map_or(
                (!inputs.is_empty()).then_some(inputs.len() as u64),
                |s| Some(s + inputs.len() as u64),
            ));
            prop_assert!(verifies(&key(), &from, &lines.concat(), &head));
        }

        #[test]
        fn any_single_byte_change_is_detected(
            from in starting_heads(),
            inputs in proptest::collection::vec(input(), 1..6),
            at in any::<prop::sample::Index>(),
            to in any::<u8>(),
        ) {
            let (lines, head) = seal_all(&key(), &from, &inputs);
            let mut bytes = lines.concat();
            let i = at.index(bytes.len());
            prop_assume!(bytes[i] != to);
            bytes[i] = to;
            prop_assert!(!verifies(&key(), &from, &bytes, &head));
        }

        #[test]
        fn a_reorder_is_detected(
            from in starting_heads(),
            inputs in proptest::collection::vec(input(), 2..6),
            a in any::<prop::sample::Index>(),
            b in any::<prop::sample::Index>(),
        ) {
            let (mut lines, head) = seal_all(&key(), &from, &inputs);
            let (a, b) = (a.index(lines.len()), b.index(lines.len()));
            prop_assume!(a != b);
            lines.swap(a, b);
            prop_assert!(!verifies(&key(), &from, &lines.concat(), &head));
        }

        #[test]
        fn a_dropped_record_is_detected(
            from in starting_heads(),
            inputs in proptest::collection::vec(input(), 1..6),
            at in any::<prop::sample::Index>(),
        ) {
            let (mut lines, head) = seal_all(&key(), &from, &inputs);
            lines.remove(at.index(lines.len()));
            prop_assert!(!verifies(&key(), &from, &lines.concat(), &head));
        }

        /// Records of another chain sealed with the same key (same start, other content)
        /// spliced in, in place of some of this chain's or added to them.
        #[test]
        fn a_splice_from_another_chain_is_detected(
            from in starting_heads(),
            inputs in proptest::collection::vec(input(), 1..6),
            others in proptest::collection::vec(input(), 1..6),
            at in any::<prop::sample::Index>(),
            take in 1usize..4,
            replace in any::<bool>(),
        ) {
            let (mut lines, head) = seal_all(&key(), &from, &inputs);
            let (theirs, _) = seal_all(&key(), &from, &others);
            let i = at.index(lines.len());
            let spliced: Vec<Vec<u8>> = theirs.into_iter().skip(i).take(take).collect();
            prop_assume!(!spliced.is_empty());
            let cut = if replace { spliced.len().min(lines.len() - i) } else { 0 };
            let removed: Vec<Vec<u8>> = lines.splice(i..i + cut, spliced.clone()).collect();
            prop_assume!(removed != spliced);
            prop_assert!(!verifies(&key(), &from, &lines.concat(), &head));
        }

        /// A chain sealed with another key does not verify with this one.
        #[test]
        fn another_key_is_detected(
            inputs in proptest::collection::vec(input(), 1..4),
        ) {
            let other = AuditKey::from_bytes([8; 32]);
            let (lines, head) = seal_all(&other, &Head::default(), &inputs);
            prop_assert!(!verifies(&key(), &Head::default(), &lines.concat(), &head));
        }
    }

    /// The negative cases above can fail: the check is not vacuous (an unchanged chain passes,
    /// a chain checked against the wrong head does not).
    #[test]
    fn the_check_itself_tells_a_good_chain_from_a_bad_head() {
        let inputs = vec![
            Input {
                record_type: "x".into(),
                run: "R".into(),
                epoch: None,
                data: b"{}".to_vec(),
                ms: 1_700_000_000_123,
            };
            3
        ];
        let (lines, head) = seal_all(&key(), &Head::default(), &inputs);
        assert!(verifies(&key(), &Head::default(), &lines.concat(), &head));
        let (shorter, shorter_head) = seal_all(&key(), &Head::default(), &inputs[..2]);
        assert!(verifies(
            &key(),
            &Head::default(),
            &shorter.concat(),
            &shorter_head
        ));
        assert!(!verifies(
            &key(),
            &Head::default(),
            &shorter.concat(),
            &head
        ));
        assert!(
            String::from_utf8(lines[0].clone())
                .unwrap()
                .contains("\"time\":\"2023-11-14T22:13:20.123Z\"")
        );
    }
}
