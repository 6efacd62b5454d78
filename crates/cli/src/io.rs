//! `stripefs io`: an in-process command runner in the style of `xfs_io`.
//!
//! Commands run in order against the file system on the given targets; most act on the
//! file opened last. Output follows xfs_io's format so that scripts and eyes trained on it
//! read it directly. I/O goes through the page cache unless the file was opened with
//! `open -d` (direct: bypasses the cache, which is written back and invalidated around it). Differences: the default I/O buffer (`-b`) is 1 MiB rather than 4 KiB,
//! so that a plain `pwrite 0 1g` exercises striping; `-S` fills with one byte value.

use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use stripefs::{
    Attr, CreateParams, FallocMode, File, FileFlags, FileKind, Follow, Fs, OpenMode, RenameMode,
    Whence,
};

use crate::size::{human, parse_size};
use crate::targets::{open_all_with, split_target_options};

const DEFAULT_BUF: u64 = 1 << 20;

/// Which way a measured I/O goes (`pwrite`/`pread`, and the benchmarks').
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    Write,
    Read,
}

impl Dir {
    /// As the benchmarks' tables and JSON spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Dir::Write => "write",
            Dir::Read => "read",
        }
    }
}

/// Run xfs_io-style commands against a stripefs file system (in-process).
#[derive(Debug, clap::Args)]
#[command(after_help = COMMANDS_HELP)]
pub struct IoArgs {
    /// A command to run; repeat for several (run in order). See the list below.
    #[arg(short = 'c', long = "command", required = true)]
    commands: Vec<String>,
    /// Mount options, `key=value[,...]`: folio_size, folio_sizing=file|fixed, cache_size,
    /// dirty_limit, readahead, readahead_mode=async|sync, writeback_depth,
    /// writeback_copy=lend|stage, read_copy=swap|bounce, wb_batch=files|single,
    /// dirty_tracking=block|folio, eof_zeroing=cache|flush, prealloc=on|off,
    /// datacow=on|off, commit_interval, writeback_interval; for NBD targets nbd_timeout=SECS|NNms,
    /// nbd_conns=N.
    #[arg(short = 'o', long = "options")]
    options: Vec<String>,
    /// All targets of the file system (any order): paths, or NBD URIs
    /// (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH).
    #[arg(required = true)]
    targets: Vec<PathBuf>,
}

const COMMANDS_HELP: &str = "Commands:
  open [-f] [-t] [-d] PATH   open PATH (-f create, -t truncate, -d direct I/O)
  close                      close the current file
  pwrite [-b BS] [-S SEED] [-q DEPTH] OFF LEN   write LEN bytes at OFF in BS-sized calls
                             (-q: direct files only, DEPTH I/Os in flight at once)
  pread [-v] [-b BS] [-q DEPTH] OFF LEN   read LEN bytes at OFF (-v dumps them)
  truncate LEN               set the file size
  falloc [-k] OFF LEN        preallocate (-k keeps the size)
  fpunch OFF LEN             deallocate a range (reads as zeros)
  fzero [-k] OFF LEN         zero a range (-k keeps the size)
  reflink SRC [SRC_OFF DST_OFF LEN]  share SRC's blocks into the open file (FICLONE, or
                             FICLONERANGE for a range; LEN 0: to SRC's end)
  seek -d|-h OFF             next data (-d) or hole (-h) at or after OFF
  chattr +C|-C|=C|= [PATH]   set or clear No_COW (e2fsprogs' letter C; changes only an
                             empty file or a directory) of PATH or the open file
  lsattr [PATH]              attribute letters of PATH or the open file, as lsattr
  fsync | fdatasync          flush the current file
  sync                       commit the whole file system
  stat                       attributes of the current file
  bmap | fiemap              the current file's extent map
  statfs                     file system space
  mkdir PATH | rmdir PATH | unlink PATH | rename OLD NEW | ls [PATH]
Sizes and offsets take k/m/g/t suffixes.";

struct Current {
    path: String,
    file: File,
}

struct Runner {
    fs: Fs,
    cur: Option<Current>,
}

/// Runs the commands; returns 0 if all succeeded, 1 otherwise.
pub fn run(a: &IoArgs) -> Result<i32, String> {
    let (engine, target_opts) = split_target_options(&a.options)?;
    let targets = open_all_with(&a.targets, &target_opts)?;
    let (fs, report) = Fs::mount(targets, crate::mount_opts::parse(&engine)?)
        .map_err(|e| format!("mount failed: {e}"))?;
    if report.replayed_txns > 0 || report.orphans_freed > 0 {
        eprintln!(
            "recovered: {} journal transactions replayed, {} orphans freed",
            report.replayed_txns, report.orphans_freed
        );
    }
    let mut r = Runner { fs, cur: None };
    let mut status = 0;
    for c in &a.commands {
        let words: Vec<&str> = c.split_whitespace().collect();
        let Some(&name) = words.first() else { continue };
        if let Err(e) = r.exec(name, &words[1..]) {
            eprintln!("{name}: {e}");
            status = 1;
        }
    }
    r.cur = None;
    r.fs.unmount().map_err(|e| format!("unmount failed: {e}"))?;
    Ok(status)
}

fn flag(args: &mut Vec<&str>, f: &str) -> bool {
    let before = args.len();
    args.retain(|a| *a != f);
    args.len() != before
}

fn opt_value(args: &mut Vec<String>, f: &str) -> Result<Option<String>, String> {
    match args.iter().position(|a| a == f) {
        None => Ok(None),
        Some(i) if i + 1 < args.len() => {
            let v = args.remove(i + 1);
            args.remove(i);
            Ok(Some(v))
        }
        Some(_) => Err(format!("{f} needs a value")),
    }
}

/// The value of option `f` as a size (k/m/g suffixes), removed from `args`.
fn size_opt(args: &mut Vec<String>, f: &str) -> Result<Option<u64>, String> {
    opt_value(args, f)?.map(|v| parse_size(&v)).transpose()
}

fn two_sizes(args: &[String]) -> Result<(u64, u64), String> {
    match args {
        [o, l] => Ok((parse_size(o)?, parse_size(l)?)),
        _ => Err("expected OFFSET LENGTH".into()),
    }
}

impl Runner {
    fn exec(&mut self, name: &str, args: &[&str]) -> Result<(), String> {
        let e = |x: stripefs::FsError| x.to_string();
        match name {
            "open" => self.open(args),
            "close" => {
                self.cur = None;
                Ok(())
            }
            "pwrite" => self.pwrite(args),
            "pread" => self.pread(args),
            "truncate" => {
                let [len] = args else {
                    return Err("expected LENGTH".into());
                };
                self.file()?.set_len(parse_size(len)?).map_err(e)
            }
            "falloc" => self.falloc(args),
            "fpunch" => self.fpunch_fzero(args, "fpunch"),
            "fzero" => self.fpunch_fzero(args, "fzero"),
            "reflink" => self.reflink(args),
            "seek" => self.seek(args),
            "chattr" => self.chattr(args),
            "lsattr" => self.lsattr(args),
            "fsync" => self.file()?.sync_all().map_err(e),
            "fdatasync" => self.file()?.sync_data().map_err(e),
            "sync" => self.fs.sync().map_err(e),
            "stat" => self.stat(),
            "bmap" | "fiemap" => self.bmap(),
            "statfs" => self.statfs(),
            "mkdir" => self.on_parent(args, |fs, p, n| {
                fs.mkdir(p, n, CreateParams::with_perm(0o755)).map(drop)
            }),
            "rmdir" => self.on_parent(args, |fs, p, n| fs.rmdir(p, n)),
            "unlink" => self.on_parent(args, |fs, p, n| fs.unlink(p, n)),
            "rename" => self.rename(args),
            "ls" => self.ls(args),
            "help" => {
                println!("{COMMANDS_HELP}");
                Ok(())
            }
            other => Err(format!("unknown command '{other}' (try 'help')")),
        }
    }

    fn file(&self) -> Result<&File, String> {
        self.cur
            .as_ref()
            .map(|c| &c.file)
            .ok_or_else(|| "no file is open (use 'open PATH')".to_string())
    }

    fn open(&mut self, args: &[&str]) -> Result<(), String> {
        let mut a = args.to_vec();
        let create = flag(&mut a, "-f");
        let trunc = flag(&mut a, "-t");
        let mode = if flag(&mut a, "-d") {
            OpenMode::Direct
        } else {
            OpenMode::Cached
        };
        let [path] = a[..] else {
            return Err("usage: open [-f] [-t] [-d] PATH".into());
        };
        let p = Path::new(path);
        let ino = match self.fs.resolve(p, Follow::Yes) {
            Ok(ino) => ino,
            Err(stripefs::FsError::NotFound) if create => {
                let (parent, name) = self.fs.resolve_parent(p).map_err(|e| e.to_string())?;
                self.fs
                    .create(parent, name, CreateParams::with_perm(0o644))
                    .map_err(|e| e.to_string())?
                    .ino
            }
            Err(e) => return Err(format!("{path}: {e}")),
        };
        let file = self
            .fs
            .open_file_with(ino, mode)
            .map_err(|e| e.to_string())?;
        if trunc {
            file.set_len(0).map_err(|e| e.to_string())?;
        }
        self.cur = Some(Current {
            path: path.to_string(),
            file,
        });
        Ok(())
    }

    /// xfs_io's `reflink`: the whole of SRC (`FICLONE`) or a range (`FICLONERANGE`) onto
    /// the open file, sharing blocks (`Fs::clone_file`, `Fs::clone_range`).
    fn reflink(&mut self, args: &[&str]) -> Result<(), String> {
        let (path, range) = match args {
            [p] => (*p, None),
            [p, so, d, l] => (*p, Some((parse_size(so)?, parse_size(d)?, parse_size(l)?))),
            _ => return Err("usage: reflink SRC [SRC_OFF DST_OFF LEN]".into()),
        };
        let src = self
            .fs
            .resolve(Path::new(path), Follow::Yes)
            .map_err(|e| format!("{path}: {e}"))?;
        let dst = self.file()?.ino();
        let t = Instant::now();
        let (n, at) = match range {
            None => (self.fs.clone_file(src, dst), 0),
            Some((so, d, l)) => (self.fs.clone_range(src, so, dst, d, l), d),
        };
        let n = n.map_err(|e| e.to_string())?;
        report("linked", n, n, at, 1, t.elapsed().as_secs_f64());
        Ok(())
    }

    /// PATH's inode and how to name it, or the open file's.
    fn target(&self, path: Option<&str>) -> Result<(stripefs::Ino, String), String> {
        match path {
            Some(p) => self
                .fs
                .resolve(Path::new(p), Follow::Yes)
                .map(|i| (i, p.to_string()))
                .map_err(|e| format!("{p}: {e}")),
            None => {
                let c = self
                    .cur
                    .as_ref()
                    .ok_or("no file is open (use 'open PATH')")?;
                Ok((c.file.ino(), c.path.clone()))
            }
        }
    }

    /// e2fsprogs' `chattr` for the one letter kept, `C` (`FS_NOCOW_FL`): `+C`, `-C`, `=C`
    /// or `=` (no flags). Other letters are refused here; the library refuses their bits.
    fn chattr(&mut self, args: &[&str]) -> Result<(), String> {
        let usage = "usage: chattr +C|-C|=C|= [PATH]";
        let (mode, path) = match args {
            [m] => (*m, None),
            [m, p] => (*m, Some(*p)),
            _ => return Err(usage.into()),
        };
        let (op, letters) = mode.split_at_checked(1).ok_or(usage)?;
        if let Some(c) = letters.chars().find(|&c| c != 'C') {
            return Err(format!(
                "attribute '{c}' is not supported (only C, No_COW, is kept)"
            ));
        }
        let (ino, name) = self.target(path)?;
        let old = self
            .fs
            .file_flags(ino)
            .map_err(|e| format!("{name}: {e}"))?;
        let want = match (op, letters.is_empty()) {
            ("+", false) => old.with(FileFlags::NOCOW),
            ("-", false) => old.without(FileFlags::NOCOW),
            ("=", true) => FileFlags::NONE,
            ("=", false) => FileFlags::NOCOW,
            _ => return Err(usage.into()),
        };
        self.fs
            .set_file_flags(ino, want)
            .map_err(|e| format!("{name}: {e}"))
    }

    /// e2fsprogs' `lsattr` line: its 22 letters in order, `-` for each flag not set (only
    /// `C`, the 16th, can be), then the name.
    fn lsattr(&self, args: &[&str]) -> Result<(), String> {
        let path = match args {
            [] => None,
            [p] => Some(*p),
            _ => return Err("usage: lsattr [PATH]".into()),
        };
        let (ino, name) = self.target(path)?;
        let f = self
            .fs
            .file_flags(ino)
            .map_err(|e| format!("{name}: {e}"))?;
        let c = if f.contains(FileFlags::NOCOW) {
            'C'
        } else {
            '-'
        };
        println!("{}{c}{} {name}", "-".repeat(15), "-".repeat(6));
        Ok(())
    }

    fn pwrite(&mut self, args: &[&str]) -> Result<(), String> {
        let mut a: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
        let bs = size_opt(&mut a, "-b")?.unwrap_or(DEFAULT_BUF).max(1);
        let seed = size_opt(&mut a, "-S")?.unwrap_or(0xcd);
        let depth = size_opt(&mut a, "-q")?;
        let (off, len) = two_sizes(&a)?;
        if let Some(depth) = depth {
            return self.queued(Dir::Write, off, len, bs, depth, seed as u8);
        }
        let buf = vec![seed as u8; bs.min(len.max(1)) as usize];
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        let t = Instant::now();
        let (mut done, mut ops) = (0u64, 0u64);
        while done < len {
            let n = (len - done).min(bs) as usize;
            let at = off + done;
            c.file.write_at(at, &buf[..n]).map_err(|e| e.to_string())?;
            done += n as u64;
            ops += 1;
        }
        report("wrote", done, len, off, ops, t.elapsed().as_secs_f64());
        Ok(())
    }

    fn pread(&mut self, args: &[&str]) -> Result<(), String> {
        let mut a: Vec<String> = args.iter().map(|s| (*s).to_string()).collect();
        let verbose = a.iter().any(|x| x == "-v");
        a.retain(|x| x != "-v");
        let bs = size_opt(&mut a, "-b")?.unwrap_or(DEFAULT_BUF).max(1);
        let depth = size_opt(&mut a, "-q")?;
        let (off, len) = two_sizes(&a)?;
        if let Some(depth) = depth {
            return self.queued(Dir::Read, off, len, bs, depth, 0);
        }
        let mut buf = vec![0u8; bs.min(len.max(1)) as usize];
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        let t = Instant::now();
        let (mut done, mut ops) = (0u64, 0u64);
        while done < len {
            let want = (len - done).min(bs) as usize;
            let at = off + done;
            let n = c
                .file
                .read_at(at, &mut buf[..want])
                .map_err(|e| e.to_string())?;
            ops += 1;
            if verbose {
                dump(off + done, &buf[..n]);
            }
            done += n as u64;
            if n < want {
                break;
            }
        }
        report("read", done, len, off, ops, t.elapsed().as_secs_f64());
        Ok(())
    }

    /// `-q DEPTH`: keeps DEPTH direct I/Os of `bs` bytes in flight through the queue.
    fn queued(
        &self,
        dir: Dir,
        off: u64,
        len: u64,
        bs: u64,
        depth: u64,
        fill: u8,
    ) -> Result<(), String> {
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        if c.file.mode() != OpenMode::Direct {
            return Err("-q needs a file opened with 'open -d'".into());
        }
        let q = self.fs.dio_queue();
        let buf = vec![fill; bs as usize];
        let fh = c.file.fh();
        let t = Instant::now();
        let (mut next, mut done, mut ops) = (0u64, 0u64, 0u64);
        let mut first_err = None;
        while done < len && first_err.is_none() {
            while next < len && (q.in_flight() as u64) < depth.max(1) {
                let n = (len - next).min(bs);
                let at = off + next;
                let r = if dir == Dir::Write {
                    q.submit_write(at, fh, at, &buf[..n as usize])
                } else {
                    q.submit_read(at, fh, at, n as usize)
                };
                r.map_err(|e| e.to_string())?;
                next += n;
            }
            for comp in q.reap(1) {
                ops += 1;
                match comp.result {
                    Ok(n) => done += n as u64,
                    Err(e) => first_err = Some(e.to_string()),
                }
            }
            if next >= len && q.in_flight() == 0 && done < len {
                break; // short reads at EOF
            }
        }
        for comp in q.reap(q.in_flight()) {
            if let Err(e) = comp.result {
                first_err.get_or_insert(e.to_string());
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        report(
            match dir {
                Dir::Write => "wrote",
                Dir::Read => "read",
            },
            done,
            len,
            off,
            ops,
            t.elapsed().as_secs_f64(),
        );
        Ok(())
    }

    fn falloc(&mut self, args: &[&str]) -> Result<(), String> {
        let mut a: Vec<&str> = args.to_vec();
        let keep = flag(&mut a, "-k");
        let a: Vec<String> = a.iter().map(|s| (*s).to_string()).collect();
        let (off, len) = two_sizes(&a)?;
        let mode = if keep {
            FallocMode::KeepSize
        } else {
            FallocMode::Allocate
        };
        self.file()?
            .fallocate(mode, off, len)
            .map_err(|e| e.to_string())
    }

    fn fpunch_fzero(&mut self, args: &[&str], which: &str) -> Result<(), String> {
        let mut a: Vec<&str> = args.to_vec();
        let keep = flag(&mut a, "-k");
        let a: Vec<String> = a.iter().map(|s| (*s).to_string()).collect();
        let (off, len) = two_sizes(&a)?;
        let mode = match which {
            "fpunch" => FallocMode::PunchHole,
            _ => FallocMode::ZeroRange { keep_size: keep },
        };
        self.file()?
            .fallocate(mode, off, len)
            .map_err(|e| e.to_string())
    }

    fn seek(&self, args: &[&str]) -> Result<(), String> {
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        let (what, name, off) = match args {
            ["-d", off] => (Whence::Data, "DATA", parse_size(off)?),
            ["-h", off] => (Whence::Hole, "HOLE", parse_size(off)?),
            _ => return Err("usage: seek -d|-h OFFSET".into()),
        };
        println!("Whence\tResult");
        match self.fs.seek(c.file.ino(), off, what) {
            Ok(r) => println!("{name}\t{r}"),
            Err(stripefs::FsError::NoSuchOffset) => println!("{name}\tEOF"),
            Err(e) => return Err(e.to_string()),
        }
        Ok(())
    }

    fn stat(&self) -> Result<(), String> {
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        let a = c.file.stat().map_err(|e| e.to_string())?;
        println!("fd.path = \"{}\"", c.path);
        println!(
            "fd.flags = non-sync,{},read-write",
            match c.file.mode() {
                OpenMode::Direct => "direct",
                OpenMode::Cached => "non-direct",
            }
        );
        print_attr(&a);
        Ok(())
    }

    fn bmap(&self) -> Result<(), String> {
        let c = self
            .cur
            .as_ref()
            .ok_or("no file is open (use 'open PATH')")?;
        let size = c.file.stat().map_err(|e| e.to_string())?.size;
        let ranges = self.fs.extents(c.file.ino()).map_err(|e| e.to_string())?;
        println!("{}:", c.path);
        let mut n = 0;
        let mut at = 0u64;
        let line = |n: &mut usize, from: u64, len: u64, what: String| {
            println!(" {n}: [{}..{}]: {what}", from / 512, (from + len) / 512 - 1);
            *n += 1;
        };
        for r in &ranges {
            if r.file_off > at {
                line(&mut n, at, r.file_off - at, "hole".into());
            }
            let state = if r.written { "" } else { " unwritten" };
            let what = format!(
                "target {} [{}..{}]{state}",
                r.target,
                r.target_off / 512,
                (r.target_off + r.len) / 512 - 1
            );
            line(&mut n, r.file_off, r.len, what);
            at = r.file_off + r.len;
        }
        if at < size {
            line(&mut n, at, size.next_multiple_of(512) - at, "hole".into());
        }
        Ok(())
    }

    fn statfs(&self) -> Result<(), String> {
        let s = self.fs.statfs().map_err(|e| e.to_string())?;
        println!("statfs.f_bsize = {}", s.block_size);
        println!("statfs.f_blocks = {}", s.blocks);
        println!("statfs.f_bfree = {}", s.blocks_free);
        println!("statfs.f_bavail = {}", s.blocks_avail);
        println!("statfs.f_files = {}", s.files);
        println!("statfs.f_ffree = {}", s.files_free);
        Ok(())
    }

    fn on_parent(
        &self,
        args: &[&str],
        op: impl Fn(&Fs, stripefs::Ino, &std::ffi::OsStr) -> stripefs::Result<()>,
    ) -> Result<(), String> {
        let [path] = args else {
            return Err("expected PATH".into());
        };
        let (parent, name) = self
            .fs
            .resolve_parent(Path::new(path))
            .map_err(|e| format!("{path}: {e}"))?;
        op(&self.fs, parent, name).map_err(|e| format!("{path}: {e}"))
    }

    fn rename(&self, args: &[&str]) -> Result<(), String> {
        let [from, to] = args else {
            return Err("expected OLD NEW".into());
        };
        let (sp, sn) = self
            .fs
            .resolve_parent(Path::new(from))
            .map_err(|e| format!("{from}: {e}"))?;
        let (dp, dn) = self
            .fs
            .resolve_parent(Path::new(to))
            .map_err(|e| format!("{to}: {e}"))?;
        self.fs
            .rename(sp, sn, dp, dn, RenameMode::Replace)
            .map_err(|e| e.to_string())
    }

    fn ls(&self, args: &[&str]) -> Result<(), String> {
        let path = args.first().copied().unwrap_or("/");
        let ino = self
            .fs
            .resolve(Path::new(path), Follow::Yes)
            .map_err(|e| format!("{path}: {e}"))?;
        for e in self.fs.readdir(ino).map_err(|e| e.to_string())? {
            let a = self.fs.getattr(e.ino).map_err(|e| e.to_string())?;
            let kind = match e.kind {
                FileKind::Directory => 'd',
                FileKind::Symlink => 'l',
                FileKind::Regular => '-',
                _ => 's',
            };
            println!(
                "{kind} {:>8} {:>12} {}",
                e.ino.0,
                a.size,
                String::from_utf8_lossy(std::ffi::OsStr::from_bytes(&e.name).as_bytes())
            );
        }
        Ok(())
    }
}

fn print_attr(a: &Attr) {
    let kind = match a.kind {
        FileKind::Regular => "regular file",
        FileKind::Directory => "directory",
        FileKind::Symlink => "symbolic link",
        _ => "special file",
    };
    println!("stat.ino = {}", a.ino.0);
    println!("stat.type = {kind}");
    println!("stat.size = {}", a.size);
    println!("stat.blocks = {}", a.blocks);
    println!("stat.mode = 0{:o}", a.mode);
    println!("stat.nlink = {}", a.nlink);
    println!("stat.atime = {}.{:09}", a.atime.sec, a.atime.nsec);
    println!("stat.mtime = {}.{:09}", a.mtime.sec, a.mtime.nsec);
    println!("stat.ctime = {}.{:09}", a.ctime.sec, a.ctime.nsec);
    if let Some(l) = a.layout {
        println!("stripe.count = {}", l.count);
        println!("stripe.unit = {}", l.unit_bytes);
        println!("stripe.first_target = {}", l.first_target);
    }
}

fn report(verb: &str, done: u64, want: u64, off: u64, ops: u64, secs: f64) {
    println!("{verb} {done}/{want} bytes at offset {off}");
    let secs_nz = secs.max(1e-9);
    let rate = human((done as f64 / secs_nz) as u64);
    println!(
        "{}, {ops} ops; {secs:.4} sec ({rate}/sec and {:.4} ops/sec)",
        human(done),
        ops as f64 / secs_nz
    );
}

fn dump(base: u64, data: &[u8]) {
    for (i, chunk) in data.chunks(16).enumerate() {
        let hex: Vec<String> = chunk.iter().map(|b| format!("{b:02x}")).collect();
        let text: String = chunk
            .iter()
            .map(|&b| {
                if b.is_ascii_graphic() || b == b' ' {
                    b as char
                } else {
                    '.'
                }
            })
            .collect();
        println!(
            "{:08x}:  {:<47}  {text}",
            base + (i * 16) as u64,
            hex.join(" ")
        );
    }
}
