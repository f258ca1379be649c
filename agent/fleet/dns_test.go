package fleet_test

import (
	"context"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"golang.org/x/net/dns/dnsmessage"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// dnsServer is a DNS server on UDP 127.0.0.1 that the test controls: it
// answers A queries for one name with the address set, AAAA with none,
// and NXDOMAIN for any other name. It counts the A queries it answered.
type dnsServer struct {
	conn *net.UDPConn
	name dnsmessage.Name

	mu      sync.Mutex
	addr    netip.Addr
	queries int
}

func startDNS(t *testing.T, name string, addr netip.Addr) *dnsServer {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	s := &dnsServer{conn: c, name: dnsmessage.MustNewName(name + "."), addr: addr}
	t.Cleanup(func() { c.Close() })
	go s.serve()
	return s
}

// set points the name at addr.
func (s *dnsServer) set(addr netip.Addr) {
	s.mu.Lock()
	s.addr = addr
	s.mu.Unlock()
}

func (s *dnsServer) serve() {
	buf := make([]byte, 1500)
	for {
		n, from, err := s.conn.ReadFromUDP(buf)
		if err != nil {
			return
		}
		var p dnsmessage.Parser
		h, err := p.Start(buf[:n])
		if err != nil {
			continue
		}
		q, err := p.Question()
		if err != nil {
			continue
		}
		b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, Authoritative: true})
		b.EnableCompression()
		b.StartQuestions()
		b.Question(q)
		b.StartAnswers()
		if !strings.EqualFold(q.Name.String(), s.name.String()) {
			b = dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RCode: dnsmessage.RCodeNameError})
			b.StartQuestions()
			b.Question(q)
		} else if q.Type == dnsmessage.TypeA {
			s.mu.Lock()
			a := s.addr.As4()
			s.queries++
			s.mu.Unlock()
			b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 1}, dnsmessage.AResource{A: a})
		}
		out, err := b.Finish()
		if err != nil {
			continue
		}
		s.conn.WriteToUDP(out, from)
	}
}

// resolver is a net.Resolver that asks only this server.
func (s *dnsServer) resolver() *net.Resolver {
	addr := s.conn.LocalAddr().String()
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "udp", addr)
	}}
}

// TestFleetDNSMoves (issue 40, item 7): the store's host name moves from
// one server (127.0.0.1) to another (127.0.0.2, same port) while the first
// stays up: a member resolves the name again within max(ttl, 1 s) (at
// most 30 s), reconnects, and reports to the new store, where a member
// started later finds it: the fleet does not split.
func TestFleetDNSMoves(t *testing.T) {
	old := testenv.StartRedis(t, testenv.RedisOptions{})
	_, port, _ := net.SplitHostPort(old.Addrs[0])
	ln, err := net.Listen("tcp", "127.0.0.2:"+port)
	if err != nil {
		t.Skipf("127.0.0.2 is not usable here: %v", err)
	}
	ln.Close()
	p, _ := strconv.Atoi(port)
	moved := testenv.StartRedis(t, testenv.RedisOptions{Host: "127.0.0.2", Port: p})
	dns := startDNS(t, "store.test", netip.MustParseAddr("127.0.0.1"))
	cfg := testConfig("redis://store.test:"+port, "dns", "a")
	cfg.Resolver = dns.resolver()
	a := join(t, cfg, 100)
	onOld := entries(t, old.Addrs[0], "dns")
	if !onOld["a"] {
		t.Fatalf("a is not on the store the name first resolves to: %v", onOld)
	}

	dns.set(netip.MustParseAddr("127.0.0.2"))
	start := time.Now()
	if !waitFor(50, func() bool { return entries(t, moved.Addrs[0], "dns")["a"] }) {
		t.Fatalf("a does not report to the store the name moved to after %v:\n%s", time.Since(start), a.log)
	}
	t.Logf("a followed the name in %v", time.Since(start).Round(10*time.Millisecond))
	if d := time.Since(start); d > testTTL+10*testReport {
		t.Errorf("a followed the name after %v; want within ttl (%v) and a report", d, testTTL)
	}
	cfg.Member = "b"
	b := join(t, cfg, 300)
	shares(t, 20, a, b)
}

// entries is the members whose entries the store at addr holds for fleet.
func entries(t *testing.T, addr, fleet string) map[string]bool {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	ks, err := c.HKeys(context.Background(), "{tierlimit:fleet:"+fleet+"}:est2").Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, k := range ks {
		out[k] = true
	}
	return out
}
