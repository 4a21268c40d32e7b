//! The store's promises: a saved cache is found by the longest prefix a prompt shares with
//! it and read back intact; a shorter conversation never evicts a longer one that covers it;
//! a cache of another model file or other options is never handed out; the byte bound drops
//! the oldest first, across models; files are 0600 in 0700 folders and no symlink is
//! followed; a changed file is refused.

use std::os::unix::fs::{MetadataExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use hangar_prompt_cache::{
    CacheError, EXT, Identity, PAYLOAD_EXT, Saving, Store, default_max_bytes,
};

const MIB: u64 = 1 << 20;

fn model_file(dir: &Path, name: &str, bytes: &[u8]) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, bytes).unwrap();
    path
}

fn identity(dir: &Path) -> Identity {
    Identity::of(&model_file(dir, "m.gguf", b"GGUF model bytes"), "n_ctx=512").unwrap()
}

/// Saves `payload` as the engine's file for `tokens`.
fn save(store: &mut Store, tokens: &[i32], payload: &[u8]) -> Result<Saving, CacheError> {
    store.save_with(tokens, |path| std::fs::write(path, payload).is_ok())
}

/// The engine's file of saved cache `index`, read.
fn read(store: &mut Store, index: usize) -> Result<Vec<u8>, CacheError> {
    store.payload(index).map(|path| std::fs::read(path).unwrap())
}

/// The saved caches' headers under `root`.
fn saved_files(root: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    for model in std::fs::read_dir(root).unwrap() {
        for f in std::fs::read_dir(model.unwrap().path()).unwrap() {
            let path = f.unwrap().path();
            if path.extension().is_some_and(|e| e == EXT) {
                files.push(path);
            }
        }
    }
    files
}

#[test]
fn a_saved_cache_is_found_by_the_longest_shared_prefix_and_read_back_intact() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("prompt-cache");
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    assert_eq!(
        save(&mut store, &[1, 2, 3, 4, 5], b"state of five").unwrap(),
        Saving::Saved(92 + 5 * 4 + 13)
    );
    assert_eq!(
        save(&mut store, &[1, 2, 9, 9], b"state of the other").unwrap(),
        Saving::Saved(92 + 4 * 4 + 18)
    );

    // Reopened (a later load): found by the prefix the new prompt shares.
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    assert_eq!(store.len(), 2);
    let (index, shared) = store.best(&[1, 2, 3, 4, 7, 8], 0).unwrap();
    assert_eq!((store.tokens(index), shared), (&[1, 2, 3, 4, 5][..], 4));
    assert_eq!(read(&mut store, index).unwrap(), b"state of five");
    // Not when a slot already shares as much.
    assert_eq!(store.best(&[1, 2, 3, 4, 7, 8], 4), None);
    assert_eq!(store.best(&[7, 7], 0), None);
}

#[test]
fn a_short_conversation_after_a_long_one_does_not_evict_it_and_a_longer_turn_replaces_it() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pc");
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    let long: Vec<i32> = (0..2000).collect();
    assert!(matches!(save(&mut store, &long, b"long").unwrap(), Saving::Saved(_)));
    // A short request sharing the long one's start: covered, nothing written or dropped.
    assert_eq!(save(&mut store, &long[..10], b"short").unwrap(), Saving::Covered);
    // An unrelated short one is saved beside it.
    assert!(matches!(save(&mut store, &[5000, 5001], b"other").unwrap(), Saving::Saved(_)));
    assert_eq!(saved_files(&root).len(), 2);
    let (index, shared) = store.best(&long[..1500], 0).unwrap();
    assert_eq!((shared, read(&mut store, index).unwrap()), (1500, b"long".to_vec()));
    // The conversation's next turn extends it: the longer cache replaces the shorter.
    let longer: Vec<i32> = (0..2100).collect();
    assert!(matches!(save(&mut store, &longer, b"longer").unwrap(), Saving::Saved(_)));
    assert_eq!(saved_files(&root).len(), 2);
    let (index, _) = store.best(&long, 0).unwrap();
    assert_eq!(read(&mut store, index).unwrap(), b"longer");
}

#[test]
fn a_cache_of_another_model_file_or_other_options_is_never_restored() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pc");
    let file = model_file(dir.path(), "a.gguf", b"GGUF weights of a");
    let ours = Identity::of(&file, "n_ctx=512 type_k=f16").unwrap();
    let mut store = Store::open(&root, "chat", ours, 64 * MIB).unwrap();
    save(&mut store, &[1, 2, 3], b"state").unwrap();

    let options = Identity::of(&file, "n_ctx=512 type_k=q8_0").unwrap();
    let replaced = Identity::of(
        &model_file(dir.path(), "a.gguf", b"GGUF weights of b"),
        "n_ctx=512 type_k=f16",
    )
    .unwrap();
    assert_ne!(options, ours);
    assert_ne!(replaced, ours);
    for other in [options, replaced] {
        let store = Store::open(&root, "chat", other, 64 * MIB).unwrap();
        assert!(store.is_empty());
        assert_eq!(store.best(&[1, 2, 3], 0), None);
    }
    // Left on disk: the original file and options find it again.
    let again = Identity::of(
        &model_file(dir.path(), "a.gguf", b"GGUF weights of a"),
        "n_ctx=512 type_k=f16",
    );
    assert_eq!(Store::open(&root, "chat", again.unwrap(), 64 * MIB).unwrap().len(), 1);
}

#[test]
fn files_of_one_size_head_and_tail_that_differ_in_the_middle_are_other_models() {
    let dir = tempfile::tempdir().unwrap();
    let mut bytes = vec![7u8; 3 * MIB as usize];
    let a = model_file(dir.path(), "a.gguf", &bytes);
    let same = model_file(dir.path(), "copy-of-a.gguf", &bytes);
    bytes[(3 * MIB / 2) as usize] ^= 1;
    let b = model_file(dir.path(), "b.gguf", &bytes);
    let id = |file: &std::path::Path| Identity::of(file, "n_ctx=512").unwrap();
    assert_ne!(id(&a), id(&b), "a byte in the middle tells them apart");
    assert_eq!(id(&a), id(&same), "the same bytes elsewhere are the same model");
    assert_eq!(id(&a), id(&a), "asked again (the digest remembered)");
    // Rewritten in place with other bytes (another size): read again.
    std::fs::write(&a, &bytes[..2 * MIB as usize]).unwrap();
    assert_ne!(id(&a), id(&same));
}

#[test]
fn the_byte_bound_drops_the_oldest_first_across_models() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pc");
    let id = identity(dir.path());
    let payload = vec![7u8; 1000];
    let each = 92 + 4 + 1000; // header, one token, payload
    let mut a = Store::open(&root, "a", id, 3 * each).unwrap();
    let mut b = Store::open(&root, "b", id, 3 * each).unwrap();
    save(&mut a, &[1], &payload).unwrap();
    let first = saved_files(&root)[0].clone();
    set_mtime_back(&first, 300);
    set_mtime_back(&first.with_extension(PAYLOAD_EXT), 300);
    save(&mut b, &[2], &payload).unwrap();
    save(&mut a, &[3], &payload).unwrap();
    assert_eq!(saved_files(&root).len(), 3);
    // A fourth goes over the bound: the oldest (a's first) goes, whichever model saved.
    save(&mut b, &[4], &payload).unwrap();
    assert_eq!(saved_files(&root).len(), 3);
    assert!(!first.exists() && !first.with_extension(PAYLOAD_EXT).exists());
    let a = Store::open(&root, "a", id, 3 * each).unwrap();
    assert_eq!((a.best(&[1], 0), a.best(&[3], 0).map(|(_, n)| n)), (None, Some(1)));
    // Alone over the bound: not written.
    let mut small = Store::open(&root, "c", id, 100).unwrap();
    assert_eq!(save(&mut small, &[1], &payload).unwrap(), Saving::TooLarge);
}

fn set_mtime_back(path: &Path, seconds: u64) {
    let file = std::fs::File::options().write(true).open(path).unwrap();
    let when = std::time::SystemTime::now() - std::time::Duration::from_secs(seconds);
    file.set_modified(when).unwrap();
}

#[test]
fn files_are_0600_in_0700_folders_and_no_symlink_is_followed() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pc");
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    save(&mut store, &[1, 2], b"secret prompt state").unwrap();
    let header = &saved_files(&root)[0];
    let file = &header.with_extension(PAYLOAD_EXT);
    assert_eq!(std::fs::metadata(header).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(file).unwrap().mode() & 0o777, 0o600);
    assert_eq!(std::fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
    assert_eq!(std::fs::metadata(file.parent().unwrap()).unwrap().mode() & 0o777, 0o700);

    // A root that is a symlink is refused, not written through.
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let link = dir.path().join("link");
    symlink(&elsewhere, &link).unwrap();
    let refused = Store::open(&link, "chat", identity(dir.path()), 64 * MIB).unwrap_err();
    assert!(matches!(refused, CacheError::Unsafe { .. }), "{refused}");
    // A saved payload replaced by a symlink (to a copy of itself) is not read through it.
    let copy = dir.path().join("copy");
    std::fs::copy(file, &copy).unwrap();
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    std::fs::remove_file(file).unwrap();
    symlink(&copy, file).unwrap();
    assert!(matches!(read(&mut store, 0), Err(CacheError::Unsafe { .. })));
    assert!(!file.exists() && copy.exists(), "the link is removed, its target untouched");
    assert!(Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap().is_empty());
    // A folder opened up by someone is closed again.
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o755)).unwrap();
    Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    assert_eq!(std::fs::metadata(&root).unwrap().mode() & 0o777, 0o700);
}

#[test]
fn a_changed_or_truncated_file_is_refused_and_forgotten() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("pc");
    let mut store = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    save(&mut store, &[1, 2], b"payload bytes").unwrap();
    let file = saved_files(&root)[0].clone();
    let payload = file.with_extension(PAYLOAD_EXT);
    let mut bytes = std::fs::read(&payload).unwrap();
    *bytes.last_mut().unwrap() ^= 1;
    std::fs::write(&payload, &bytes).unwrap();
    let err = read(&mut store, 0).unwrap_err();
    assert!(err.to_string().contains("digest"), "{err}");
    assert!(store.is_empty() && !file.exists() && !payload.exists());

    save(&mut store, &[3, 4], b"payload bytes").unwrap();
    let file = saved_files(&root)[0].clone();
    let bytes = std::fs::read(&file).unwrap();
    std::fs::write(&file, &bytes[..bytes.len() - 3]).unwrap();
    let reopened = Store::open(&root, "chat", identity(dir.path()), 64 * MIB).unwrap();
    assert!(reopened.is_empty() && !file.exists(), "a truncated header is removed at open");
    assert!(!file.with_extension(PAYLOAD_EXT).exists(), "with its payload");
}

#[test]
fn the_default_bound_is_a_small_share_of_the_disk() {
    let dir = tempfile::tempdir().unwrap();
    let bound = default_max_bytes(&dir.path().join("not/yet/made"));
    assert!(bound > 0 && bound <= 32 << 30, "{bound}");
}
