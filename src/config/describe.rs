//! The effective configuration as one line, for `init`'s INFO log.

use std::fmt;

use super::{Config, HcaSpec, RailAddr, SHOWN_BYTES, SplitMode, layers, shown};

impl fmt::Display for Config {
    /// The effective configuration, one line, for the INFO log.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let hca = |l: &[HcaSpec]| {
            if l.is_empty() {
                "auto".to_string()
            } else {
                l.iter().map(|h| h.to_string()).collect::<Vec<_>>().join(",")
            }
        };
        let split = match self.split {
            SplitMode::Auto => "auto".to_string(),
            SplitMode::Sout => "sout".to_string(),
            SplitMode::Sup => "sup".to_string(),
            SplitMode::Percent(p) => format!("{p}%"),
        };
        let addr = |a: &Option<RailAddr>| match a {
            None => "default".to_string(),
            Some(RailAddr::Ip(ip)) => ip.to_string(),
            Some(RailAddr::Interface(i)) => i.clone(),
        };
        let layered = layers::Resolved {
            rails: self.rails,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            relaxed_ordering: self.relaxed_ordering,
            dmabuf: self.dmabuf,
            pkey_index: self.pkey_index,
        };
        write!(
            f,
            "fabric={:?} hca={} hca_sout={} hca_sup={} nccl_devices={:?} split={split} split_min_bytes={} srq_depth={} \
             {} rtt_alpha={} rtt_beta={} probe_interval_us={} probe_rate={} \
             stats_file={} prom_file={} stats_interval_ms={} soft_addr=sout:{}/sup:{} connect_timeout_ms={} hang_report_ms={} outage_grace_ms={}{}",
            self.fabric,
            self.hca_filter.as_ref().map_or("all".to_string(), |h| format!("{h} ({})", self.hca_filter_var)),
            hca(&self.hca_sout),
            hca(&self.hca_sup),
            self.nccl_devices,
            self.split_min_bytes,
            self.srq_depth,
            layers::describe(&layered, &self.origins),
            self.rtt_alpha,
            self.rtt_beta,
            self.probe_interval_us,
            self.probe_rate,
            self.stats_file.as_deref().map_or("off".to_string(), |f| if f.len() > SHOWN_BYTES {
                shown(f)
            } else {
                f.to_string()
            }),
            self.prom_file.as_deref().map_or("off".to_string(), |f| if f.len() > SHOWN_BYTES {
                shown(f)
            } else {
                f.to_string()
            }),
            self.stats_interval_ms,
            addr(&self.soft_sout_addr),
            addr(&self.soft_sup_addr),
            self.connect_timeout_ms,
            self.hang_report_ms,
            self.outage_grace_ms(),
            if self.outage_grace.is_none() { " (auto)" } else { "" },
        )
    }
}
