//! `-o key=value[,key=value...]` mount options, shared by the commands that mount.

use std::time::Duration;

use stripefs::DirtyTracking;
use stripefs::FolioSizing;
use stripefs::ZeroMode;
use stripefs::{AtimePolicy, AtimeUpdate, AtimeWrite, DirAtime, MountOptions};

use crate::size::parse_size;

/// The keys `-o` understands, for help texts and errors.
pub const KEYS: &str = "folio_size=SIZE (largest folio), folio_sizing=file|fixed, cache_size=SIZE, dirty_limit=SIZE, meta_cache=SIZE (metadata page cache, default 64m), inode_cache=N (decoded inodes in core, default one per 512 bytes of meta_cache), checkpoint=background|inline, readahead=SIZE, readahead_mode=async|sync (sync: wait for the window inside the read), writeback_depth=N (batches in flight, 1: wait for each), \
writeback_copy=lend|stage (stage: copy written bytes into staging buffers), \
read_copy=swap|bounce (bounce: copy read bytes from a bounce buffer into the folios), \
dirty_throttle=wait|write (write: a writer over the dirty limit writes its file back itself), \
wb_batch=files|single (single: write dirty files back one at a time), \
dirty_tracking=block|folio, eof_zeroing=cache|flush, prealloc=on|off, \
datacow=on|off (new files copy on write; default off), \
nocow_check=unlocked|locked (locked: the in-place decision's checks hold the metadata lock), \
commit_interval=SECS (0: off), writeback_interval=SECS (0: off), \
relatime (default), strictatime, noatime, nodiratime, lazytime and their opposites";

/// Applies an access-time word as `mount(8)` spells it; `false` if `word` is none.
/// `strictatime` also undoes `noatime` and `nodiratime`, as for the kernel.
pub fn atime_word(p: &mut AtimePolicy, word: &str) -> bool {
    match word {
        "relatime" | "atime" | "nostrictatime" => p.update = AtimeUpdate::Relative,
        "norelatime" => p.update = AtimeUpdate::Strict,
        "strictatime" => {
            p.update = AtimeUpdate::Strict;
            p.dirs = DirAtime::Update;
        }
        "noatime" => p.update = AtimeUpdate::Never,
        "nodiratime" => p.dirs = DirAtime::Skip,
        "diratime" => p.dirs = DirAtime::Update,
        "lazytime" => p.write = AtimeWrite::Lazy,
        "nolazytime" => p.write = AtimeWrite::Journal,
        _ => return false,
    }
    true
}

/// Parses `-o` values into mount options (defaults for anything not given).
///
/// # Errors
/// A sentence naming the bad key or value.
pub fn parse(list: &[String]) -> Result<MountOptions, String> {
    let mut o = MountOptions::default();
    for item in list
        .iter()
        .flat_map(|s| s.split(','))
        .filter(|s| !s.is_empty())
    {
        if atime_word(&mut o.atime, item) {
            continue;
        }
        let (k, v) = item
            .split_once('=')
            .ok_or_else(|| format!("mount option {item:?} is not key=value (known: {KEYS})"))?;
        let secs = |v: &str| -> Result<Option<Duration>, String> {
            let n: u64 = v
                .parse()
                .map_err(|_| format!("{k}: {v:?} is not a number of seconds"))?;
            Ok((n > 0).then(|| Duration::from_secs(n)))
        };
        match k {
            "folio_size" => {
                o.cache.folio_bytes =
                    u32::try_from(parse_size(v)?).map_err(|_| format!("{k} too large"))?
            }
            "folio_sizing" => {
                o.cache.folio_sizing = match v {
                    "file" => FolioSizing::File,
                    "fixed" => FolioSizing::Fixed,
                    _ => return Err(format!("folio_sizing must be file or fixed, not {v:?}")),
                }
            }
            "cache_size" => o.cache.budget_bytes = parse_size(v)?,
            "dirty_limit" => o.cache.dirty_limit_bytes = parse_size(v)?,
            "checkpoint" => {
                o.checkpoints = match v {
                    "background" => stripefs::Checkpoints::Background,
                    "inline" => stripefs::Checkpoints::Inline,
                    _ => {
                        return Err(format!(
                            "checkpoint must be background or inline, not {v:?}"
                        ))
                    }
                }
            }
            "meta_cache" => {
                let m = stripefs::MetaCacheBytes(parse_size(v)?);
                m.validate(4096)
                    .map_err(|e| format!("{e} (-o meta_cache={v})"))?;
                o.meta_cache = m;
            }
            "inode_cache" => {
                let n = v
                    .parse()
                    .map_err(|_| format!("inode_cache must be a count of inodes, not {v:?}"))?;
                let b = stripefs::InodeBound(n);
                b.validate()
                    .map_err(|e| format!("{e} (-o inode_cache={v})"))?;
                o.inode_cache = Some(b);
            }
            "readahead" => o.cache.readahead_bytes = parse_size(v)?,
            "readahead_mode" => {
                o.cache.readahead = match v {
                    "async" => stripefs::ReadaheadMode::Async,
                    "sync" => stripefs::ReadaheadMode::Sync,
                    _ => return Err(format!("readahead_mode must be async or sync, not {v:?}")),
                }
            }
            "writeback_depth" => {
                o.cache.writeback_depth = match v.parse::<u32>() {
                    Ok(n) if n >= 1 => stripefs::WbDepth(n),
                    _ => return Err(format!("{k}: {v:?} is not a number of batches from 1")),
                }
            }
            "writeback_copy" => {
                o.cache.writeback_copy = match v {
                    "lend" => stripefs::WbCopy::Lend,
                    "stage" => stripefs::WbCopy::Stage,
                    _ => return Err(format!("writeback_copy must be lend or stage, not {v:?}")),
                }
            }
            "dirty_throttle" => {
                o.cache.dirty_throttle = match v {
                    "wait" => stripefs::DirtyThrottle::Wait,
                    "write" => stripefs::DirtyThrottle::Write,
                    _ => return Err(format!("dirty_throttle must be wait or write, not {v:?}")),
                }
            }
            "read_copy" => {
                o.cache.read_copy = match v {
                    "swap" => stripefs::ReadCopy::Swap,
                    "bounce" => stripefs::ReadCopy::Bounce,
                    _ => return Err(format!("read_copy must be swap or bounce, not {v:?}")),
                }
            }
            "dirty_tracking" => {
                o.cache.dirty_tracking = match v {
                    "block" => DirtyTracking::Block,
                    "folio" => DirtyTracking::Folio,
                    _ => return Err(format!("dirty_tracking must be block or folio, not {v:?}")),
                }
            }
            "eof_zeroing" => {
                o.eof_zeroing = match v {
                    "cache" => ZeroMode::Cache,
                    "flush" => ZeroMode::Flush,
                    _ => return Err(format!("eof_zeroing must be cache or flush, not {v:?}")),
                }
            }
            "prealloc" => {
                o.speculative_prealloc = match v {
                    "on" => true,
                    "off" => false,
                    _ => return Err(format!("prealloc must be on or off, not {v:?}")),
                }
            }
            "datacow" => {
                o.datacow = match v {
                    "on" => stripefs::DataCow::On,
                    "off" => stripefs::DataCow::Off,
                    _ => return Err(format!("datacow must be on or off, not {v:?}")),
                }
            }
            "nocow_check" => {
                o.nocow_check = match v {
                    "unlocked" => stripefs::NocowCheck::Unlocked,
                    "locked" => stripefs::NocowCheck::Locked,
                    _ => return Err(format!("nocow_check must be unlocked or locked, not {v:?}")),
                }
            }
            "dio_unaligned" => {
                o.dio_unaligned = match v {
                    "shared" => stripefs::UnalignedPolicy::Shared,
                    "exclusive" => stripefs::UnalignedPolicy::Exclusive,
                    _ => {
                        return Err(format!(
                            "dio_unaligned must be shared or exclusive, not {v:?}"
                        ))
                    }
                }
            }
            "dio_submit" => {
                o.dio_submit = match v {
                    "parallel" => stripefs::DioSubmit::Parallel,
                    "serial" => stripefs::DioSubmit::Serial,
                    _ => return Err(format!("dio_submit must be parallel or serial, not {v:?}")),
                }
            }
            "wb_batch" => {
                o.wb_batch = match v {
                    "files" => stripefs::WbBatch::Files,
                    "single" => stripefs::WbBatch::Single,
                    _ => return Err(format!("wb_batch must be files or single, not {v:?}")),
                }
            }
            "commit_interval" => o.commit_interval = secs(v)?,
            "writeback_interval" => o.writeback_interval = secs(v)?,
            _ => return Err(format!("unknown mount option {k:?} (known: {KEYS})")),
        }
    }
    Ok(o)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_errors() {
        let o = parse(&[
            "dirty_tracking=folio,eof_zeroing=flush".into(),
            "folio_size=16k,folio_sizing=fixed".into(),
            "commit_interval=0".into(),
        ])
        .unwrap();
        assert_eq!(o.cache.dirty_tracking, DirtyTracking::Folio);
        assert_eq!(o.eof_zeroing, ZeroMode::Flush);
        assert_eq!(o.cache.folio_bytes, 16384);
        assert_eq!(o.cache.folio_sizing, FolioSizing::Fixed);
        assert!(parse(&["folio_sizing=big".into()])
            .unwrap_err()
            .contains("file or fixed"));
        assert_eq!(o.commit_interval, None);
        assert!(parse(&["dirty_tracking=page".into()])
            .unwrap_err()
            .contains("block or folio"));
        assert_eq!(
            parse(&["readahead_mode=sync".into()])
                .unwrap()
                .cache
                .readahead,
            stripefs::ReadaheadMode::Sync
        );
        assert!(parse(&["readahead_mode=later".into()])
            .unwrap_err()
            .contains("async or sync"));
        assert_eq!(
            parse(&[]).unwrap().cache.read_copy,
            stripefs::ReadCopy::Swap
        );
        assert_eq!(
            parse(&["read_copy=bounce".into()]).unwrap().cache.read_copy,
            stripefs::ReadCopy::Bounce
        );
        assert!(parse(&["read_copy=move".into()])
            .unwrap_err()
            .contains("swap or bounce"));
        assert_eq!(
            parse(&[]).unwrap().cache.dirty_throttle,
            stripefs::DirtyThrottle::Wait
        );
        assert_eq!(
            parse(&["dirty_throttle=write".into()])
                .unwrap()
                .cache
                .dirty_throttle,
            stripefs::DirtyThrottle::Write
        );
        assert!(parse(&["dirty_throttle=sleep".into()])
            .unwrap_err()
            .contains("wait or write"));
        assert_eq!(
            parse(&["wb_batch=single".into()]).unwrap().wb_batch,
            stripefs::WbBatch::Single
        );
        assert_eq!(parse(&[]).unwrap().wb_batch, stripefs::WbBatch::Files);
        assert!(parse(&["wb_batch=all".into()])
            .unwrap_err()
            .contains("files or single"));
        assert!(parse(&["bogus=1".into()])
            .unwrap_err()
            .contains("unknown mount option"));
        let a = parse(&["strictatime,nodiratime,lazytime".into()])
            .unwrap()
            .atime;
        assert_eq!(
            (a.update, a.dirs, a.write),
            (AtimeUpdate::Strict, DirAtime::Skip, AtimeWrite::Lazy)
        );
        assert_eq!(parse(&[]).unwrap().atime, AtimePolicy::default());
        assert_eq!(
            parse(&["noatime".into()]).unwrap().atime.update,
            AtimeUpdate::Never
        );
        let back = parse(&["noatime,nodiratime,strictatime".into()])
            .unwrap()
            .atime;
        assert_eq!(
            (back.update, back.dirs),
            (AtimeUpdate::Strict, DirAtime::Update)
        );
        assert_eq!(
            parse(&[]).unwrap().meta_cache,
            stripefs::MetaCacheBytes(64 << 20)
        );
        assert_eq!(
            parse(&["meta_cache=16m".into()]).unwrap().meta_cache,
            stripefs::MetaCacheBytes(16 << 20)
        );
        assert_eq!(
            parse(&["meta_cache=256K".into()])
                .unwrap()
                .meta_cache
                .bytes(),
            256 << 10
        );
        assert_eq!(parse(&[]).unwrap().inode_cache, None);
        assert_eq!(
            parse(&["inode_cache=5000".into()]).unwrap().inode_cache,
            Some(stripefs::InodeBound(5000))
        );
        let zero = parse(&["inode_cache=0".into()]).unwrap_err();
        assert!(zero.contains("inode_cache=0"), "{zero}");
        assert!(parse(&["inode_cache=lots".into()]).is_err());
        let small = parse(&["meta_cache=100k".into()]).unwrap_err();
        assert!(
            small.contains("minimum of 64 pages") && small.contains("meta_cache=100k"),
            "{small}"
        );
        assert_eq!(
            parse(&[]).unwrap().checkpoints,
            stripefs::Checkpoints::Background
        );
        assert_eq!(
            parse(&["checkpoint=inline".into()]).unwrap().checkpoints,
            stripefs::Checkpoints::Inline
        );
        assert!(parse(&["checkpoint=sometimes".into()])
            .unwrap_err()
            .contains("background or inline"));
        assert!(parse(&["meta_cache=lots".into()])
            .unwrap_err()
            .contains("bad size"));
        assert_eq!(parse(&[]).unwrap().datacow, stripefs::DataCow::Off);
        assert_eq!(
            parse(&["datacow=on".into()]).unwrap().datacow,
            stripefs::DataCow::On
        );
        assert_eq!(
            parse(&[]).unwrap().nocow_check,
            stripefs::NocowCheck::Unlocked
        );
        assert_eq!(
            parse(&["nocow_check=locked".into()]).unwrap().nocow_check,
            stripefs::NocowCheck::Locked
        );
        assert!(parse(&["nocow_check=maybe".into()])
            .unwrap_err()
            .contains("unlocked or locked"));
        assert!(parse(&["datacow=yes".into()])
            .unwrap_err()
            .contains("on or off"));
        assert!(parse(&["novalue".into()])
            .unwrap_err()
            .contains("key=value"));
    }
}
