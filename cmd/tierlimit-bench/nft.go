package main

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tierlimit/tierlimit/tiers"
)

// nftRules is the nearest nftables equivalent of policy p on device dev:
// the tiers are expressible, as a chain of token buckets.
//
// At the netdev ingress hook of dev (the earliest nftables sees a packet,
// before the IP stack), selected packets (udp dport 514) jump to a chain
// where
//
//	limit rate T_1/second                   accept          (tier 0)
//	limit rate (T_{k+1} - T_k)/second       goto tier_k     (tier k < K)
//	goto tier_K (or drop if 100%)                           (the last tier)
//
// and tier_k drops with "numgen random mod 10000 < drop_k × 100". A packet
// that finds tier k's bucket empty falls through to tier k+1, so with every
// bucket full, a burst's first T_1 packets pass, the next T_2 - T_1 see
// tier 1, and so on: the tiered table. It is not the same rule: a bucket
// refills continuously (rate per second) where tierlimit counts a window
// anchored at traffic, so nftables admits more while its buckets refill
// during a window, and its "window" is one second, always. Each bucket
// holds burst = one window's worth of its tier (nft_limit: tokens_max is
// burst packets; without a burst it would be 5, a pure rate limit) and
// starts full.
func nftRules(p tiers.Policy, dev string) (string, error) {
	if p.Window != time.Second {
		return "", errors.New("nftables: limit rate units are per second/minute/...: window must be 1s")
	}
	tab, err := tiers.Compile(p, 0)
	if err != nil {
		return "", err
	}
	var sb strings.Builder
	w := func(format string, a ...any) { fmt.Fprintf(&sb, format+"\n", a...) }
	w("# tierlimit-bench: the nftables equivalent of max %d, window %v, tiers %s", p.Max, p.Window, tierString(p))
	w("# Loaded with nft -f inside the collector's network namespace only.")
	w("flush ruleset")
	w("table netdev tierlimit_bench {")
	K := len(tab.Bounds)
	for k := 1; k <= K; k++ {
		drop := p.Tiers[k-1].Drop
		w("\tchain tier%d {", k)
		switch {
		case drop.Ratio() >= 1:
			w("\t\tcounter drop")
		case drop.Micro() <= 0:
			w("\t\tcounter accept")
		default:
			w("\t\tnumgen random mod 10000 < %d counter drop", (drop.Micro()+5_000)/10_000)
			w("\t\tcounter accept")
		}
		w("\t}")
	}
	w("\tchain tiers {")
	if tab.Bounds[0] > 0 {
		w("\t\tlimit rate %d/second burst %d packets counter accept", tab.Bounds[0], tab.Bounds[0])
	}
	for k := 1; k < K; k++ {
		if n := tab.Bounds[k] - tab.Bounds[k-1]; n > 0 {
			w("\t\tlimit rate %d/second burst %d packets counter goto tier%d", n, n, k)
		}
	}
	w("\t\tgoto tier%d", K)
	w("\t}")
	w("\tchain ingress {")
	w("\t\ttype filter hook ingress device %q priority -500; policy accept;", dev)
	for _, r := range p.Select {
		if r.Proto != tiers.ProtoUDP || len(r.Dests) > 0 {
			continue // the flood is udp; tcp syn counting is left out
		}
		var ports []string
		for _, pr := range r.Ports {
			if pr.First == pr.Last {
				ports = append(ports, fmt.Sprint(pr.First))
			} else {
				ports = append(ports, fmt.Sprintf("%d-%d", pr.First, pr.Last))
			}
		}
		w("\t\tudp dport { %s } jump tiers", strings.Join(ports, ", "))
	}
	w("\t}")
	w("}")
	return sb.String(), nil
}

func tierString(p tiers.Policy) string {
	var s []string
	for _, t := range p.Tiers {
		s = append(s, t.String())
	}
	return strings.Join(s, ", ")
}
