//! The configuration files' manual pages, gpu.toml(5) and host.toml(5): every key, from the
//! complete example docs/operations.md shows under each endpoint's heading (one source for
//! the docs and the page, and a test parses it as the endpoint would), and each section a
//! file may add, as the docs show it.

/// Which endpoint's file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// `dxpu gpu`'s, gpu.toml.
    Gpu,
    /// `dxpu host`'s, host.toml.
    Host,
}

/// The complete, commented configuration file of `role` as docs/operations.md shows it
/// (the first TOML block under its endpoint's heading): one source for the docs and the
/// page, and a test parses it as the endpoint would.
pub fn example(role: Role) -> &'static str {
    block_after(
        OPERATIONS,
        match role {
            Role::Gpu => "## `dxpu gpu`",
            Role::Host => "## `dxpu host`",
        },
    )
}

const OPERATIONS: &str = include_str!("../../../docs/operations.md");
const POOL: &str = include_str!("../../../docs/pool.md");

/// The first TOML block after `marker` in `doc` (empty if there is none).
fn block_after(doc: &'static str, marker: &str) -> &'static str {
    doc.split_once(marker)
        .and_then(|(_, rest)| rest.split_once("```toml\n"))
        .and_then(|(_, block)| block.split_once("```"))
        .map_or("", |(toml, _)| toml)
}

/// The sections a file of `role` may add, each as the docs show it: `[control]`,
/// `[metrics]`, `[pool]`, and `[pool]`'s keys for a secured etcd.
pub fn optional_sections(role: Role) -> [(&'static str, &'static str); 4] {
    [
        (
            "[control]: the control socket (docs/operations.md)",
            block_after(OPERATIONS, "## The control socket and `dxpu ctl`"),
        ),
        ("[metrics]: the Prometheus endpoint (docs/operations.md)", block_after(OPERATIONS, "## Metrics")),
        (
            "[pool]: devices from a pool on etcd (docs/pool.md)",
            block_after(
                POOL,
                match role {
                    Role::Gpu => "`[[host]]` / `[[device]]` as usual plus",
                    Role::Host => "(no `[[attach]]`: the pool says what to attach)",
                },
            ),
        ),
        (
            "[pool] with a secured etcd: TLS, client certificates, a user (docs/pool.md)",
            block_after(POOL, "## A secured etcd"),
        ),
    ]
}

/// gpu.toml(5) or host.toml(5), the page `dxpu man` writes.
pub fn man_page(role: Role) -> String {
    let (name, what, cmd) = match role {
        Role::Gpu => ("gpu.toml", "the GPU-box endpoint's configuration", "dxpu-gpu"),
        Role::Host => ("host.toml", "the host endpoint's configuration", "dxpu-host"),
    };
    let about = match role {
        Role::Gpu => {
            "The file \\fBdxpu gpu\\fR reads (\\fB--config\\fR; packaged as /etc/dxpu/gpu.toml): where it \
             listens, the link's settings, the hosts allowed in with their keys, and the devices it \
             exports (simulated, or real ones bound to vfio-pci) with the hosts that may attach each."
        }
        Role::Host => {
            "The file \\fBdxpu host\\fR reads (\\fB--config\\fR; packaged as /etc/dxpu/host.toml): the \
             link's settings and each device to attach \\(em its box, name and key, and whether it is \
             served to a virtual machine over a vfio-user socket \\(em or a \\fB[pool]\\fR to claim \
             devices from."
        }
    };
    format!(
        ".TH {upper} 5 \"\" \"dxpu {version}\" \"File Formats\"\n\
         .SH NAME\n{name} \\- {what}\n\
         .SH DESCRIPTION\n{about} TOML; an unknown key is refused, and an invalid value stops the \
         endpoint at start (or is refused on reload) with the key, the value and the reason. \
         \\fB{bin} --check --config FILE\\fR validates a file without starting.\n\
         .SH KEYS\nEvery key, with its default where it has one:\n.PP\n.nf\n{example}\n.fi\n\
         {sections}\
         .SH FILES\n.TP\n\\fI/etc/dxpu/{name}\\fR\nwhere the package's unit reads it\n\
         .SH \"SEE ALSO\"\n{cmd}(1), dxpu-ctl(1){also}; docs/operations.md in the source (the \
         control socket, metrics, capture and pool sections)\n",
        also = match role {
            Role::Gpu => ", host.toml(5)",
            Role::Host => ", gpu.toml(5) (the [link] and [impairment] keys)",
        },
        upper = name.to_uppercase(),
        version = env!("CARGO_PKG_VERSION"),
        bin = cmd.replace('-', " "),
        example = roff(example(role).trim_end()),
        sections = optional_sections(role)
            .iter()
            .map(|(title, toml)| format!(".SS \"{title}\"\n.nf\n{}\n.fi\n", roff(toml.trim_end())))
            .collect::<String>(),
    )
}

/// Text for roff: a leading dot or quote escaped, backslashes doubled.
pub fn roff(s: &str) -> String {
    s.lines()
        .map(|l| {
            let l = l.replace('\\', "\\e").replace('-', "\\-");
            if l.starts_with('.') || l.starts_with('\'') { format!("\\&{l}") } else { l }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The configuration pages' key reference is docs/operations.md's complete example, and
    /// each parses as its endpoint would parse it.
    #[test]
    fn the_configuration_pages_hold_a_file_each_endpoint_takes() {
        let dir = std::env::temp_dir().join(format!("dxpu-man-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let gpu = example(Role::Gpu);
        let host = example(Role::Host);
        assert!(gpu.contains("[[device]]") && gpu.contains("[link]"), "{gpu}");
        assert!(host.contains("[[attach]]"), "{host}");
        let (g, h, k) = (dir.join("gpu.toml"), dir.join("host.toml"), dir.join("host-b.key"));
        // Its key file where this test can write one.
        std::fs::write(&k, format!("{}\n", "ab".repeat(32))).unwrap();
        let gpu = gpu.replace("/etc/dxpu/host-b.key", k.to_str().unwrap());
        std::fs::write(&g, gpu).unwrap();
        std::fs::write(&h, host).unwrap();
        let gf: crate::config::GpuFile = crate::config::read(&g).unwrap();
        gf.options(None).unwrap();
        let hf: crate::config::HostFile = crate::config::read(&h).unwrap();
        hf.attachments(None).unwrap();
        let page = man_page(Role::Gpu);
        assert!(page.starts_with(".TH GPU.TOML 5") && page.contains("key_update_frames"), "{page}");
        assert!(man_page(Role::Host).contains("completion_timeout_ms"));
        // Every section a file may add, each with its keys, on both pages.
        for role in [Role::Gpu, Role::Host] {
            let page = man_page(role);
            for (title, toml) in optional_sections(role) {
                let section = title.split_once(':').map_or(title, |(s, _)| s);
                assert!(
                    !toml.trim().is_empty() && toml.contains(section.split(' ').next().unwrap_or("")),
                    "{title}: {toml}"
                );
                assert!(page.contains(&format!(".SS \"{title}\"")), "{title}");
            }
            for key in ["socket =", "listen =", "etcd =", "etcd_cacert", "lease_ttl_s"] {
                assert!(page.contains(key), "{key} not in the page");
            }
        }
        assert!(man_page(Role::Gpu).contains("advertise") && man_page(Role::Host).contains("want ="));
        // Lines of the example that begin with a dot or a quote cannot be taken for requests.
        assert_eq!(roff(".x\n'y\nz\\ -1"), "\\&.x\n\\&'y\nz\\e \\-1");
        let _ = std::fs::remove_dir_all(dir);
    }
}
