//! Two tiny OCI images built locally from Debian's busybox-static, so tests
//! need no registry: `localhost/busybox:test` (a shell and the applets) and
//! `localhost/pause:test` (a sandbox process that exits on SIGTERM); and
//! variants of busybox with a config and files of their own
//! ([`build_variant`]), the stand-ins for the images critest pulls.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result, bail};
use sha2::{Digest, Sha256};

pub const BUSYBOX_IMAGE: &str = "localhost/busybox:test";
pub const PAUSE_IMAGE: &str = "localhost/pause:test";

const BUSYBOX_BINARY: &str = "/bin/busybox";
const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
// The sandbox process: PID 1 of the pod, idle until told to stop.
const PAUSE_SCRIPT: &str = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done";

const MT_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const MT_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const MT_LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// Writes `busybox.oci.tar` and `pause.oci.tar` into `dir`, returning their paths.
pub fn build(dir: &Path) -> Result<[std::path::PathBuf; 2]> {
    let busybox = std::fs::read(BUSYBOX_BINARY).with_context(|| {
        format!("read {BUSYBOX_BINARY}: install it with `apt-get install busybox-static`")
    })?;
    let layer = rootfs_layer(&busybox)?;
    let busybox_tar = dir.join("busybox.oci.tar");
    let pause_tar = dir.join("pause.oci.tar");
    write_image(
        &busybox_tar,
        BUSYBOX_IMAGE,
        &[&layer],
        &busybox_config(r#""Cmd":["sh"]"#),
    )?;
    write_image(&pause_tar, PAUSE_IMAGE, &[&layer], &pause_config())?;
    Ok([busybox_tar, pause_tar])
}

/// The image config of an image of busybox: its PATH and working dir, and
/// `fields` (JSON members: `"Cmd":[...]`, `"User":"..."`, ...).
pub fn busybox_config(fields: &str) -> String {
    format!(
        r#"{{"Env":[{}],{fields},"WorkingDir":"/"}}"#,
        json_str(PATH_ENV)
    )
}

/// The image config of the pause image.
pub fn pause_config() -> String {
    busybox_config(&format!(
        r#""Entrypoint":["/bin/sh","-c",{}]"#,
        json_str(PAUSE_SCRIPT)
    ))
}

/// Writes an OCI archive of busybox named `name`, with `image_config` (see
/// [`busybox_config`]) and a layer on top holding `files` (path, mode,
/// content; in folders of mode 0755), which may replace busybox's own
/// (`etc/passwd`, `etc/group`).
pub fn build_variant(
    out: &Path,
    name: &str,
    image_config: &str,
    files: &[(&str, u32, &[u8])],
) -> Result<()> {
    let busybox = std::fs::read(BUSYBOX_BINARY).with_context(|| {
        format!("read {BUSYBOX_BINARY}: install it with `apt-get install busybox-static`")
    })?;
    let base = rootfs_layer(&busybox)?;
    if files.is_empty() {
        return write_image(out, name, &[&base], image_config);
    }
    let mut tar = tar::Builder::new(Vec::new());
    let mut folders = std::collections::BTreeSet::new();
    for (path, mode, content) in files {
        let mut parent = Path::new(path).parent();
        let mut missing = Vec::new();
        while let Some(folder) = parent.filter(|p| !p.as_os_str().is_empty()) {
            if folders.insert(folder.to_owned()) {
                missing.push(folder);
            }
            parent = folder.parent();
        }
        for folder in missing.into_iter().rev() {
            append_folder(&mut tar, &folder.to_string_lossy())?;
        }
        append(
            &mut tar,
            path,
            tar::EntryType::Regular,
            *mode,
            content,
            None,
        )?;
    }
    let top = tar.into_inner()?;
    write_image(out, name, &[&base, &top], image_config)
}

fn rootfs_layer(busybox: &[u8]) -> Result<Vec<u8>> {
    let list = std::process::Command::new(BUSYBOX_BINARY)
        .arg("--list-full")
        .output()
        .context("list busybox applets")?;
    if !list.status.success() {
        bail!("{BUSYBOX_BINARY} --list-full failed");
    }
    let applets = String::from_utf8_lossy(&list.stdout).into_owned();

    let mut tar = tar::Builder::new(Vec::new());
    for (dir, mode) in [
        ("bin", 0o755),
        ("dev", 0o755),
        ("etc", 0o755),
        ("proc", 0o555),
        ("root", 0o700),
        ("sbin", 0o755),
        ("sys", 0o555),
        ("tmp", 0o1777),
        ("usr", 0o755),
        ("usr/bin", 0o755),
        ("usr/sbin", 0o755),
        ("var", 0o755),
    ] {
        append(&mut tar, dir, tar::EntryType::Directory, mode, b"", None)?;
    }
    append(
        &mut tar,
        "bin/busybox",
        tar::EntryType::Regular,
        0o755,
        busybox,
        None,
    )?;
    append(
        &mut tar,
        "etc/passwd",
        tar::EntryType::Regular,
        0o644,
        b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        None,
    )?;
    append(
        &mut tar,
        "etc/group",
        tar::EntryType::Regular,
        0o644,
        b"root:x:0:\nnogroup:x:65534:\n",
        None,
    )?;
    for applet in applets.lines().map(str::trim).filter(|a| !a.is_empty()) {
        if applet == "bin/busybox" {
            continue;
        }
        append(
            &mut tar,
            applet,
            tar::EntryType::Symlink,
            0o777,
            b"",
            Some("/bin/busybox"),
        )?;
    }
    Ok(tar.into_inner()?)
}

/// A folder of mode 0755.
fn append_folder(tar: &mut tar::Builder<Vec<u8>>, path: &str) -> Result<()> {
    append(tar, path, tar::EntryType::Directory, 0o755, b"", None)
}

fn append(
    tar: &mut tar::Builder<Vec<u8>>,
    path: &str,
    kind: tar::EntryType,
    mode: u32,
    data: &[u8],
    link: Option<&str>,
) -> Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_entry_type(kind);
    header.set_mode(mode);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_size(data.len() as u64);
    if let Some(link) = link {
        header.set_link_name(link)?;
    }
    tar.append_data(&mut header, path, data)?;
    Ok(())
}

/// One image as an OCI layout packed in a tar, named through the
/// `io.containerd.image.name` annotation that `ctr images import` honours.
fn write_image(out: &Path, name: &str, layers: &[&[u8]], image_config: &str) -> Result<()> {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    // Uncompressed layers: a layer's digest is its diff ID.
    let diff_ids: Vec<String> = layers.iter().map(|l| json_str(&digest(l))).collect();
    let config = format!(
        r#"{{"architecture":"{arch}","os":"linux","config":{image_config},"rootfs":{{"type":"layers","diff_ids":[{}]}}}}"#,
        diff_ids.join(",")
    );
    let descriptors: Vec<String> = layers
        .iter()
        .map(|l| {
            format!(
                r#"{{"mediaType":"{MT_LAYER}","digest":"{}","size":{}}}"#,
                digest(l),
                l.len()
            )
        })
        .collect();
    let manifest = format!(
        r#"{{"schemaVersion":2,"mediaType":"{MT_MANIFEST}","config":{{"mediaType":"{MT_CONFIG}","digest":"{}","size":{}}},"layers":[{}]}}"#,
        digest(config.as_bytes()),
        config.len(),
        descriptors.join(",")
    );
    let tag = name.rsplit_once(':').map_or("latest", |(_, tag)| tag);
    let index = format!(
        r#"{{"schemaVersion":2,"manifests":[{{"mediaType":"{MT_MANIFEST}","digest":"{}","size":{},"platform":{{"architecture":"{arch}","os":"linux"}},"annotations":{{"io.containerd.image.name":{},"org.opencontainers.image.ref.name":{}}}}}]}}"#,
        digest(manifest.as_bytes()),
        manifest.len(),
        json_str(name),
        json_str(tag)
    );

    let mut tar = tar::Builder::new(Vec::new());
    append_folder(&mut tar, "blobs")?;
    append_folder(&mut tar, "blobs/sha256")?;
    for blob in layers
        .iter()
        .copied()
        .chain([config.as_bytes(), manifest.as_bytes()])
    {
        let hex = digest(blob);
        let hex = hex.trim_start_matches("sha256:");
        append(
            &mut tar,
            &format!("blobs/sha256/{hex}"),
            tar::EntryType::Regular,
            0o644,
            blob,
            None,
        )?;
    }
    append(
        &mut tar,
        "oci-layout",
        tar::EntryType::Regular,
        0o644,
        br#"{"imageLayoutVersion":"1.0.0"}"#,
        None,
    )?;
    append(
        &mut tar,
        "index.json",
        tar::EntryType::Regular,
        0o644,
        index.as_bytes(),
        None,
    )?;
    let mut file =
        std::fs::File::create(out).with_context(|| format!("create {}", out.display()))?;
    file.write_all(&tar.into_inner()?)?;
    Ok(())
}

fn digest(data: &[u8]) -> String {
    let hash = Sha256::digest(data);
    let hex: String = hash.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256:{hex}")
}

/// A JSON string literal (the inputs here are ASCII without control characters).
fn json_str(s: &str) -> String {
    format!("\"{}\"", s.replace('\\', "\\\\").replace('"', "\\\""))
}
