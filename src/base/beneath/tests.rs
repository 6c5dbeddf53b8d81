//! The capability's refusals, each checked with `openat2` and with the component walk.

use super::*;
use std::os::unix::fs::symlink;

/// Runs `check` on a fresh root, once resolved by the kernel and once by the component walk.
fn both_ways(check: impl Fn(&Path, &Beneath)) {
    for walk in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("root");
        std::fs::create_dir(&root).unwrap();
        let b = Beneath::open(&root).unwrap();
        let b = if walk { b.walking() } else { b };
        check(d.path(), &b);
    }
}

/// A directory outside the root holding `name` with the bytes `precious`.
fn outside_with(tmp: &Path, name: &str) -> PathBuf {
    let outside = tmp.join("outside");
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join(name), b"precious").unwrap();
    outside
}

#[test]
fn a_link_at_the_final_name_is_not_followed_to_read_and_is_replaced_to_write() {
    both_ways(|tmp, b| {
        let secret = tmp.join("secret");
        std::fs::write(&secret, b"precious").unwrap();
        symlink(&secret, b.root().join("latest.json")).unwrap();
        let e = b.read(Path::new("latest.json"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert!(b.open_append(Path::new("latest.json"), 0o644).is_err());
        assert!(b.open_rw(Path::new("latest.json"), true, 0o600).is_err());
        assert!(b.create_new(Path::new("latest.json"), 0o644).is_err());
        assert!(b.create_truncate(Path::new("latest.json"), 0o644).is_err());
        b.write_atomic(Path::new("latest.json"), b"new", FileMode::New(0o644))
            .unwrap();
        assert_eq!(std::fs::read(&secret).unwrap(), b"precious");
        assert_eq!(b.read(Path::new("latest.json"), 16).unwrap(), b"new");
        assert!(b.metadata(Path::new("latest.json")).unwrap().is_file());
        // No temporary file left behind.
        assert_eq!(b.list(Path::new("")).unwrap().len(), 1);
    });
}

#[test]
fn a_linked_directory_on_the_way_is_refused() {
    both_ways(|tmp, b| {
        let outside = outside_with(tmp, "f");
        std::fs::create_dir(b.root().join("real")).unwrap();
        symlink(&outside, b.root().join("real/linked")).unwrap();
        for p in ["real/linked/f", "real/linked/new"] {
            let p = Path::new(p);
            let e = b.read(p, 1 << 20).unwrap_err();
            assert!(e.to_string().contains("not a directory of ours"), "{e}");
            assert!(b.write_atomic(p, b"x", FileMode::New(0o644)).is_err());
            assert!(b.open_append(p, 0o644).is_err());
            assert!(b.metadata(p).is_err());
            assert!(b.remove_file(p).is_err());
        }
        assert!(b.list(Path::new("real/linked")).is_err());
        assert!(b.sub(Path::new("real/linked"), false).is_err());
        assert!(b.create_dir_all(Path::new("real/linked/deeper")).is_err());
        assert_eq!(std::fs::read(outside.join("f")).unwrap(), b"precious");
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 1);
        // The link itself is listed as one, and can be removed.
        let listed = b.list(Path::new("real")).unwrap();
        assert_eq!(
            listed,
            [Entry {
                name: "linked".into(),
                kind: Kind::Symlink
            }]
        );
        b.remove_file(Path::new("real/linked")).unwrap();
        assert!(outside.join("f").exists());
    });
}

#[test]
fn dot_dot_and_paths_outside_the_root_are_refused() {
    both_ways(|tmp, b| {
        std::fs::write(tmp.join("secret"), b"precious").unwrap();
        std::fs::create_dir(b.root().join("sub")).unwrap();
        for p in ["../secret", "sub/../../secret", "sub/.."] {
            let e = b.read(Path::new(p), 1 << 20).unwrap_err();
            assert!(e.to_string().contains("not below"), "{p}: {e}");
            assert!(
                b.write_atomic(Path::new(p), b"x", FileMode::New(0o644))
                    .is_err()
            );
        }
        let e = b.read(&tmp.join("secret"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not below"), "{e}");
        assert!(b.remove_file(&tmp.join("secret")).is_err());
        assert!(b.rename(Path::new("sub"), &tmp.join("moved")).is_err());
        assert_eq!(std::fs::read(tmp.join("secret")).unwrap(), b"precious");
        // An absolute path below the root is the same as the relative one.
        std::fs::write(b.root().join("sub/ok"), b"fine").unwrap();
        assert_eq!(b.read(&b.root().join("sub/ok"), 16).unwrap(), b"fine");
        assert_eq!(b.read(Path::new("sub/ok"), 16).unwrap(), b"fine");
    });
}

#[test]
fn a_fifo_a_directory_or_a_device_is_not_a_file() {
    both_ways(|_, b| {
        let fifo = b.root().join("status.json");
        // `mkfifo(1)`, as the agent would (and as on macOS, where rustix has no `mkfifoat`).
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .unwrap();
        assert!(made.success());
        // Returns at once (no writer needed): the open does not wait.
        let e = b.read(Path::new("status.json"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        assert!(b.open_append(Path::new("status.json"), 0o644).is_err());
        assert!(b.create_truncate(Path::new("status.json"), 0o644).is_err());
        assert!(b.open_rw(Path::new("status.json"), true, 0o644).is_err());
        std::fs::create_dir(b.root().join("dir")).unwrap();
        let e = b.read(Path::new("dir"), 1 << 20).unwrap_err();
        assert!(e.to_string().contains("not a regular file"), "{e}");
        let e = b
            .write_atomic(Path::new("dir"), b"x", FileMode::New(0o644))
            .unwrap_err();
        assert!(e.to_string().contains("is a directory"), "{e}");
        assert!(b.metadata(Path::new("dir")).unwrap().is_dir());
        symlink("/dev/null", b.root().join("null")).unwrap();
        assert!(b.read(Path::new("null"), 16).is_err());
        assert_eq!(b.metadata(Path::new("null")).unwrap().kind, Kind::Symlink);
        assert_eq!(
            b.metadata(Path::new("status.json")).unwrap().kind,
            Kind::Other
        );
    });
}

#[test]
fn a_file_over_the_limit_is_refused_with_its_size_named() {
    both_ways(|_, b| {
        std::fs::write(b.root().join("big"), vec![b'x'; 4097]).unwrap();
        let e = b.read(Path::new("big"), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        assert!(e.to_string().contains("larger than 4096 bytes"), "{e}");
        assert_eq!(b.read(Path::new("big"), 4097).unwrap().len(), 4097);
        let e = b.read_to_string(Path::new("big"), 10).unwrap_err();
        assert!(e.to_string().contains("larger than 10 bytes"), "{e}");
    });
}

#[test]
fn a_removed_root_is_created_again_and_a_root_that_is_a_link_is_refused() {
    for walk in [false, true] {
        let d = tempfile::tempdir().unwrap();
        let root = d.path().join("target/mcp-dev");
        let b = Beneath::create(&root).unwrap();
        let b = if walk { b.walking() } else { b };
        b.write_atomic(Path::new("status/a.json"), b"one", FileMode::New(0o644))
            .unwrap();
        std::fs::remove_dir_all(d.path().join("target")).unwrap();
        b.write_atomic(Path::new("status/a.json"), b"two", FileMode::New(0o644))
            .unwrap();
        assert_eq!(std::fs::read(root.join("status/a.json")).unwrap(), b"two");
        // A held root that is only opened (not created) is gone for good.
        let held = Beneath::open(&root).unwrap();
        std::fs::remove_dir_all(&root).unwrap();
        assert!(held.read(Path::new("status/a.json"), 16).is_err());
        // A link at the root is refused at open.
        std::fs::create_dir(d.path().join("elsewhere")).unwrap();
        symlink(d.path().join("elsewhere"), d.path().join("linked")).unwrap();
        assert!(Beneath::open(&d.path().join("linked")).is_err());
        assert!(Beneath::create(&d.path().join("linked")).is_err());
    }
}

#[test]
fn a_directory_swapped_for_a_link_after_open_is_refused_and_the_sub_handle_stays() {
    both_ways(|tmp, b| {
        let outside = outside_with(tmp, "srv.json");
        b.write_atomic(Path::new("status/srv.json"), b"one", FileMode::New(0o644))
            .unwrap();
        let held = b.sub(Path::new("status"), false).unwrap();
        std::fs::rename(b.root().join("status"), b.root().join("status.old")).unwrap();
        symlink(&outside, b.root().join("status")).unwrap();
        let e = b
            .write_atomic(Path::new("status/srv.json"), b"two", FileMode::New(0o644))
            .unwrap_err();
        assert!(e.to_string().contains("not a directory of ours"), "{e}");
        assert!(b.open_append(Path::new("status/srv.json"), 0o644).is_err());
        assert_eq!(
            std::fs::read(outside.join("srv.json")).unwrap(),
            b"precious"
        );
        // The sub-handle held before the swap still names the directory it opened.
        held.write_atomic(Path::new("srv.json"), b"three", FileMode::New(0o644))
            .unwrap();
        assert_eq!(
            std::fs::read(b.root().join("status.old/srv.json")).unwrap(),
            b"three"
        );
        assert_eq!(
            std::fs::read(outside.join("srv.json")).unwrap(),
            b"precious"
        );
    });
}

#[test]
fn files_are_created_exclusively_appended_listed_renamed_linked_and_removed() {
    both_ways(|_, b| {
        use std::io::Write as _;
        let mut f = b.create_new(Path::new("a/b/log"), 0o600).unwrap();
        f.write_all(b"one\n").unwrap();
        assert!(b.create_new(Path::new("a/b/log"), 0o600).is_err());
        b.open_append(Path::new("a/b/log"), 0o600)
            .unwrap()
            .write_all(b"two\n")
            .unwrap();
        assert_eq!(b.read(Path::new("a/b/log"), 64).unwrap(), b"one\ntwo\n");
        assert_eq!(b.metadata(Path::new("a/b/log")).unwrap().mode & 0o077, 0);
        b.hard_link(Path::new("a/b/log"), Path::new("a/log.1"))
            .unwrap();
        b.rename(Path::new("a/log.1"), Path::new("a/log.2"))
            .unwrap();
        let mut names: Vec<_> = b
            .list(Path::new("a"))
            .unwrap()
            .into_iter()
            .map(|e| (e.name.into_string().unwrap(), e.kind))
            .collect();
        names.sort();
        assert_eq!(
            names,
            [
                ("b".to_string(), Kind::Dir),
                ("log.2".to_string(), Kind::File)
            ]
        );
        b.set_mode(Path::new("a/log.2"), 0o640).unwrap();
        assert_eq!(b.metadata(Path::new("a/b/log")).unwrap().mode, 0o640);
        b.write_atomic(Path::new("a/x"), b"x", FileMode::Exactly(0o751))
            .unwrap();
        assert_eq!(b.metadata(Path::new("a/x")).unwrap().mode, 0o751);
        b.remove_file(Path::new("a/log.2")).unwrap();
        assert!(b.create_dir(Path::new("a/c"), 0o755).unwrap());
        assert!(!b.create_dir(Path::new("a/c"), 0o755).unwrap());
        assert!(b.create_dir(Path::new("a/x"), 0o755).is_err());
        b.remove_tree(Path::new("a")).unwrap();
        assert!(b.list(Path::new("")).unwrap().is_empty());
    });
}

/// A sub-handle whose directory was removed (`cargo clean`) is opened again below the root it
/// came from, every directory on the way checked: a link planted at a directory between the
/// root and it (not only at its last component) is refused, never followed.
#[test]
fn a_removed_sub_handle_is_opened_again_below_its_root_never_through_a_link() {
    both_ways(|tmp, b| {
        let outside = outside_with(tmp, "srv.jsonl");
        let audit = b.sub(Path::new("mcp-dev/audit"), true).unwrap();
        audit
            .write_atomic(Path::new("srv.jsonl"), b"one", FileMode::New(0o600))
            .unwrap();
        // Removed and made again: the handle finds the new directory (created again).
        std::fs::remove_dir_all(b.root().join("mcp-dev")).unwrap();
        audit
            .write_atomic(Path::new("srv.jsonl"), b"two", FileMode::New(0o600))
            .unwrap();
        assert_eq!(
            std::fs::read(b.root().join("mcp-dev/audit/srv.jsonl")).unwrap(),
            b"two"
        );
        // Removed, and a link planted at the intermediate `mcp-dev`: refused.
        std::fs::remove_dir_all(b.root().join("mcp-dev")).unwrap();
        std::fs::create_dir_all(outside.join("audit")).unwrap();
        symlink(&outside, b.root().join("mcp-dev")).unwrap();
        for refused in [
            audit.open_append(Path::new("srv.jsonl"), 0o600).map(drop),
            audit.write_atomic(Path::new("srv.jsonl"), b"three", FileMode::New(0o600)),
        ] {
            let e = refused.expect_err("written through a link");
            assert!(e.to_string().contains("not a directory of ours"), "{e}");
        }
        assert!(!outside.join("audit/srv.jsonl").exists());
        // A name right below the root and one further down, through the same handle.
        std::fs::remove_file(b.root().join("mcp-dev")).unwrap();
        audit.create_dir_all(Path::new("x")).unwrap();
        audit
            .open_append(Path::new("x/y.log"), 0o600)
            .and_then(|_| audit.hard_link(Path::new("x/y.log"), Path::new("y.log")))
            .and_then(|()| audit.rename(Path::new("y.log"), Path::new("z.log")))
            .unwrap();
        assert!(audit.metadata(Path::new("z.log")).unwrap().is_file());
        // The hot path (a name right below the root, opened with no check first) finds the
        // directory removed, and opens it again below the root.
        std::fs::remove_dir_all(b.root().join("mcp-dev")).unwrap();
        audit.open_append(Path::new("again.log"), 0o600).unwrap();
        assert!(b.root().join("mcp-dev/audit/again.log").is_file());
    });
}
