//! Making untrusted text safe to print on a terminal.
//!
//! Server-controlled text (tool names, descriptions, schemas, catalog diff lines, non-JSON lines
//! the server wrote on stdout, its stderr) and agent-controlled text (tool names in calls) reach
//! the reviewer's terminal. An escape sequence in it could recolour, hide, rewrite or fake what
//! the human reads (e.g. erase a line of the `approve` screen, or set the window title). Every
//! place that prints such text goes through this module:
//!
//! - [`line`]: one line of status. C0 controls (newline included, tab excepted), DEL and C1
//!   controls become visible escapes (`\x1b`, `\n`, `\u{9b}`); printable UTF-8 is kept.
//! - [`bytes_line`]: the same for raw bytes (invalid UTF-8 becomes U+FFFD).
//! - [`review`]: for the `approve` screen, where a human decides: as [`line`], and invisible or
//!   direction-changing characters (bidi controls, zero-width characters, tag characters…) are
//!   shown as `<U+202E>` so that what is displayed is what is granted.
//! - [`shell_word`]: untrusted text as one word a human can paste into a POSIX shell and
//!   get back unchanged (a suggested `approve --call ID`), or nothing when no such word is safe.
//!
//! Pure functions; no I/O.

use std::borrow::Cow;
use std::fmt::Write;

/// Whether `c` is a terminal control character: C0 (U+0000–U+001F) except tab, DEL, or C1
/// (U+0080–U+009F). A tab only moves the cursor forward; it is kept.
pub fn is_control(c: char) -> bool {
    c.is_control() && c != '\t'
}

/// Whether `c` is invisible or changes the display order of text around it: the characters a
/// reviewer cannot see (or sees in the wrong place) on the `approve` screen.
pub fn is_invisible(c: char) -> bool {
    matches!(c,
        '\u{00AD}'                  // soft hyphen
        | '\u{034F}'                // combining grapheme joiner
        | '\u{061C}'                // arabic letter mark
        | '\u{115F}' | '\u{1160}'   // hangul fillers
        | '\u{17B4}' | '\u{17B5}'
        | '\u{180B}'..='\u{180F}'   // mongolian variation selectors / vowel separator
        | '\u{200B}'..='\u{200F}'   // zero-width space/joiners, LRM, RLM
        | '\u{2028}'..='\u{202E}'   // line/paragraph separators, bidi embeddings and overrides
        | '\u{2060}'..='\u{206F}'   // word joiner, invisible operators, bidi isolates
        | '\u{3164}'                // hangul filler
        | '\u{FE00}'..='\u{FE0F}'   // variation selectors
        | '\u{FEFF}'                // zero-width no-break space
        | '\u{FFA0}'
        | '\u{FFF0}'..='\u{FFFB}'   // interlinear annotations
        | '\u{E0000}'..='\u{E007F}' // tag characters
        | '\u{E0100}'..='\u{E01EF}' // variation selectors supplement
    )
}

fn escape_control(c: char, out: &mut String) {
    match c {
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        c if (c as u32) < 0x80 => {
            let _ = write!(out, "\\x{:02x}", c as u32);
        }
        c => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
    }
}

fn clean(text: &str, invisible_too: bool) -> Cow<'_, str> {
    let bad = |c: char| is_control(c) || (invisible_too && is_invisible(c));
    if !text.chars().any(bad) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_control(c) {
            escape_control(c, &mut out);
        } else if invisible_too && is_invisible(c) {
            let _ = write!(out, "<U+{:04X}>", c as u32);
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// The first `n` characters of `text`, a prefix for display (a short hash or epoch). Never cuts
/// inside a character: a byte slice of text read from a file the agent can write panics on a
/// multi-byte character at the cut.
pub fn first_chars(text: &str, n: usize) -> &str {
    text.char_indices().nth(n).map_or(text, |(i, _)| &text[..i])
}

/// One line of untrusted text, safe for a terminal (controls escaped, printable UTF-8 kept).
pub fn line(text: &str) -> Cow<'_, str> {
    clean(text, false)
}

/// Like [`line`], keeping SGR colour sequences (`ESC [ digits;… m`): for cargo's relayed
/// stderr, which is coloured on a terminal but also carries text of the package's own code
/// verbatim (a build script's `cargo:warning=`). Any other escape sequence (OSC window title or
/// clipboard, cursor moves, erase) is shown escaped.
pub fn colored_line(text: &str) -> Cow<'_, str> {
    if !text.chars().any(is_control) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    let mut rest = text;
    while let Some(c) = rest.chars().next() {
        if c == '\u{1b}'
            && let Some(len) = sgr_len(rest)
        {
            out.push_str(&rest[..len]);
            rest = &rest[len..];
            continue;
        }
        if is_control(c) {
            escape_control(c, &mut out);
        } else {
            out.push(c);
        }
        rest = &rest[c.len_utf8()..];
    }
    Cow::Owned(out)
}

/// The length of the SGR sequence `text` starts with, if it starts with one.
fn sgr_len(text: &str) -> Option<usize> {
    let params = text.strip_prefix("\u{1b}[")?;
    let n = params
        .bytes()
        .take_while(|b| b.is_ascii_digit() || *b == b';')
        .count();
    (params.as_bytes().get(n) == Some(&b'm')).then_some(2 + n + 1)
}

/// Like [`line`] for raw bytes (a server's stdout or stderr line): invalid UTF-8 is replaced.
pub fn bytes_line(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    line(&text).into_owned()
}

/// Several lines of untrusted text (e.g. a block built from many pieces): each line is cleaned,
/// the newlines between them are kept.
pub fn lines(text: &str) -> String {
    each_line(text, line)
}

/// [`lines`] with each line as [`review`] shows it: for command output a human reads to judge
/// what happened (`audit show`, `status`, `identity`).
pub fn review_lines(text: &str) -> String {
    each_line(text, review)
}

fn each_line(text: &str, clean: fn(&str) -> Cow<'_, str>) -> String {
    let mut out = String::with_capacity(text.len());
    for (i, l) in text.split('\n').enumerate() {
        if i > 0 {
            out.push('\n');
        }
        out.push_str(&clean(l));
    }
    out
}

/// Untrusted text on the `approve` screen: controls escaped and invisible or bidi characters
/// shown as `<U+XXXX>`, so the reviewer sees every character that will be granted.
pub fn review(text: &str) -> Cow<'_, str> {
    clean(text, true)
}

/// JSON text (a line of it) with every control, invisible or bidi character written as a
/// `\uXXXX` escape: the same JSON value, safe to show on a terminal. Valid JSON holds such
/// characters only inside strings, where the escape means the same character.
pub fn json_text(text: &str) -> Cow<'_, str> {
    if !text.chars().any(|c| is_control(c) || is_invisible(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 16);
    for c in text.chars() {
        if is_control(c) || is_invisible(c) {
            let mut units = [0u16; 2];
            for unit in c.encode_utf16(&mut units) {
                let _ = write!(out, "\\u{unit:04x}");
            }
        } else {
            out.push(c);
        }
    }
    Cow::Owned(out)
}

/// `text` as one POSIX shell word that passes exactly `text`, for a command the status lines
/// suggest: bare when made only of characters no shell treats specially, else single-quoted
/// (`'` written as `'\''`), inside which nothing expands (`$(…)`, backticks, `;`). `None`
/// unless every character is printable ASCII (anything else would be shown escaped, and the
/// escaped form is not the text) other than `\` and `!` (which other shells read inside quotes).
pub fn shell_word(text: &str) -> Option<String> {
    // A backslash too: fish reads `\'` inside single quotes as an escaped quote, so the same
    // quoting would end the word early there (and `!` expands in csh even inside quotes).
    if text.is_empty()
        || !text.bytes().all(|b| (0x20..0x7f).contains(&b))
        || text.contains(['\\', '!'])
    {
        return None;
    }
    let plain = |b: u8| b.is_ascii_alphanumeric() || b"_.,:/=+-@%".contains(&b);
    if text.bytes().all(plain) {
        return Some(text.to_string());
    }
    Some(format!("'{}'", text.replace('\'', "'\\''")))
}

/// The command that approves one denied call, as the status lines suggest it: the call id
/// (the host's JSON text for it, chosen by the agent) as a safe shell word, or, when no word is
/// safe (or the id is over 128 bytes or holds a backtick), the terminal inbox that can approve
/// the call by a key.
pub fn approve_call_command(call_id: &str) -> String {
    // No backtick either: status lines show the command between backticks.
    match shell_word(call_id).filter(|_| call_id.len() <= 128 && !call_id.contains('`')) {
        // `--call=`: an id that starts with `-` is still the option's value.
        Some(word) => format!("cargo mcp-dev approve --call={word}"),
        None => "cargo mcp-dev approve --follow".to_string(),
    }
}

#[cfg(test)]
mod tests {
    /// Red-team round 21: prefixes were cut at a byte count, which panics inside a character.
    #[test]
    fn first_chars_cuts_at_characters() {
        assert_eq!(
            super::first_chars("aaaaaaaaaaaaaaaé0123", 16),
            "aaaaaaaaaaaaaaaé"
        );
        assert_eq!(super::first_chars("01M97BQ6FTCS0CHB", 12), "01M97BQ6FTCS");
        assert_eq!(super::first_chars("short", 12), "short");
        assert_eq!(super::first_chars("", 3), "");
    }

    #[test]
    fn colored_lines_keep_colour_and_nothing_else() {
        let coloured = "\u{1b}[1m\u{1b}[33mwarning\u{1b}[0m: look";
        assert_eq!(colored_line(coloured), coloured);
        let hostile =
            "a\u{1b}]52;c;cm0=\u{7}b\u{1b}[2K\u{1b}[1Ac\u{1b}[31;1mred\u{1b}[m\u{9b}2J\u{1b}";
        let shown = colored_line(hostile);
        assert_eq!(
            shown,
            "a\\x1b]52;c;cm0=\\x07b\\x1b[2K\\x1b[1Ac\u{1b}[31;1mred\u{1b}[m\\u{9b}2J\\x1b"
        );
        let kept: Vec<_> = shown.match_indices('\u{1b}').collect();
        assert_eq!(kept.len(), 2, "only the two SGR sequences keep their ESC");
        assert_eq!(colored_line("tab\tok"), "tab\tok");
    }

    use super::*;
    use proptest::prelude::*;

    /// Issue 12, high finding "terminal escape injection": escape sequences and controls are
    /// shown, never sent to the terminal.
    #[test]
    fn controls_are_escaped_printable_text_is_kept() {
        assert_eq!(line("write_item"), "write_item");
        assert!(matches!(line("ünïcödé ✓ 工具"), Cow::Borrowed(_)));
        assert_eq!(line("a\x1b[2Jb"), "a\\x1b[2Jb");
        assert_eq!(line("x\x1b]0;owned\x07"), "x\\x1b]0;owned\\x07");
        assert_eq!(line("l1\nl2\r\t"), "l1\\nl2\\r\t");
        assert_eq!(line("\u{9b}31m"), "\\u{9b}31m");
        assert_eq!(line("\x7f"), "\\x7f");
        assert_eq!(bytes_line(b"ok \xff\x1b[1m"), "ok \u{FFFD}\\x1b[1m");
        assert_eq!(lines("a\x1b\nb"), "a\\x1b\nb");
        assert_eq!(review_lines("a\u{202E}\nb\x1b"), "a<U+202E>\nb\\x1b");
    }

    #[test]
    fn json_text_escapes_what_a_terminal_would_act_on_and_keeps_the_value() {
        let raw = "{\"tool\":\"a\u{9b}31m\u{202E}b\u{7f}\u{E0041}\u{200B}ü\"}";
        let safe = json_text(raw);
        assert_eq!(
            safe,
            "{\"tool\":\"a\\u009b31m\\u202eb\\u007f\\udb40\\udc41\\u200bü\"}"
        );
        let v = |t: &str| serde_json::from_str::<serde_json::Value>(t).unwrap();
        assert_eq!(v(&safe), v(raw), "the same JSON value");
        assert!(matches!(json_text("{\"a\":\"plain ü\"}"), Cow::Borrowed(_)));
    }

    #[test]
    fn review_shows_invisible_and_bidi_characters() {
        assert_eq!(review("write\u{202E}metI"), "write<U+202E>metI");
        assert_eq!(review("de\u{200B}lete"), "de<U+200B>lete");
        assert_eq!(review("a\u{E0041}"), "a<U+E0041>");
        assert_eq!(review("\u{FEFF}x\x1b"), "<U+FEFF>x\\x1b");
        assert_eq!(review("plain"), "plain");
        // Status lines keep them (they are printable), approve shows them.
        assert_eq!(line("a\u{202E}b"), "a\u{202E}b");
    }

    /// What a real POSIX shell passes for `word` as one argument.
    fn through_sh(word: &str) -> Vec<String> {
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!("for a in {word}; do printf '%s\\0' \"$a\"; done"))
            .output()
            .expect("sh runs");
        assert!(out.status.success(), "{word}: {out:?}");
        let text = String::from_utf8(out.stdout).unwrap();
        text.split_terminator('\0').map(str::to_string).collect()
    }

    /// Red-team round 9: the suggested `approve --call ID` carried the agent's id with only
    /// `escape_debug`, so `$(…)` in it ran in the human's shell. A shell word passes exactly the
    /// text, however hostile; an id that is not printable ASCII gets no word at all.
    #[test]
    fn a_shell_word_passes_exactly_its_text() {
        for text in [
            "7",
            "-5",
            "\"req-7\"",
            "\"7$(echo INJECTED)\"",
            "\"`touch /tmp/x`\"",
            "\"a;b|c&d>e\"",
            "\"it's\"",
            "'''",
            "\"$HOME ${x:-y} * ? [a] ~\"",
            " spaced ",
        ] {
            let word = shell_word(text).expect("printable ASCII");
            assert_eq!(through_sh(&word), [text], "{word}");
        }
        assert_eq!(shell_word("7"), Some("7".into()), "plain text stays bare");
        // Red-team round 18: `\` and `!` are read inside single quotes by fish and csh.
        for bad in [
            "",
            "\u{202e}x",
            "\x1b[2J",
            "caf\u{e9}",
            "a\nb",
            "a\x7fb",
            "x\\';touch p;#",
            "a!b",
        ] {
            assert_eq!(shell_word(bad), None, "{bad:?}");
        }
        assert_eq!(
            approve_call_command("-5"),
            "cargo mcp-dev approve --call=-5"
        );
        assert_eq!(
            approve_call_command("\"\u{9b}\""),
            "cargo mcp-dev approve --follow"
        );
        let long = format!("\"{}\"", "x".repeat(200));
        assert_eq!(
            approve_call_command(&long),
            "cargo mcp-dev approve --follow"
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn any_printable_ascii_text_survives_the_shell(text in "[ -~]{1,40}") {
            match shell_word(&text) {
                Some(word) => prop_assert_eq!(through_sh(&word), vec![text]),
                None => prop_assert!(text.contains(['\\', '!']), "refused {:?}", text),
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2048, failure_persistence: None, ..ProptestConfig::default() })]
        #[test]
        fn no_control_or_invisible_survives(s in any::<String>()) {
            let l = line(&s);
            prop_assert!(!l.chars().any(is_control));
            let r = review(&s);
            prop_assert!(!r.chars().any(|c| is_control(c) || is_invisible(c)));
            // Text without anything to escape is untouched.
            if !s.chars().any(|c| is_control(c) || is_invisible(c)) {
                prop_assert_eq!(r.as_ref(), s.as_str());
            }
        }
    }
}
