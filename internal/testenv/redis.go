package testenv

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/sandbox"
)

// RedisOptions says what StartRedis runs.
type RedisOptions struct {
	// Password, when set, is the server's requirepass.
	Password string
	// TLS makes the server TLS-only (--port 0, --tls-port): StartRedis
	// generates a CA and a server certificate for 127.0.0.1 and writes the
	// CA to Redis.CAFile.
	TLS bool
	// ClientAuth (with TLS) makes the servers ask for a client certificate
	// (tls-auth-clients yes, Redis's default): StartRedis writes one the
	// CA signs to Redis.ClientCert and Redis.ClientKey.
	ClientAuth bool
	// CertDNS (with TLS), when set, is the only name the server
	// certificate holds (a DNS name, no IP address): a client that checks
	// it against 127.0.0.1 fails.
	CertDNS string
	// SentinelPassword, when set, is the Sentinel's own requirepass.
	SentinelPassword string
	// Host and Port, when set, are the address a standalone server listens
	// on (127.0.0.2, say) and its port, in place of 127.0.0.1 and a free
	// port.
	Host string
	Port int
	// Cluster, when 3 or more, runs a Redis Cluster of that many masters
	// (no replicas) made with redis-cli --cluster create.
	Cluster int
	// Sentinel adds a Sentinel (redis-server --sentinel) that monitors the
	// server as master RedisMaster; URL then names the Sentinel.
	Sentinel bool
	// NetNS, when set, runs a standalone server inside that namespace
	// (through nsenter), listening on Addr:6379 there; the members reach
	// it over the links the test makes into the namespace. CLI runs
	// redis-cli there too.
	NetNS *NS
	Addr  netip.Addr
}

// RedisMaster is the master name a Sentinel of StartRedis monitors.
const RedisMaster = "tltest"

// Redis is a redis-server (the Debian package) that a test runs on
// 127.0.0.1 (or on an address in a namespace, RedisOptions.NetNS) with its own directory and no persistence (--save ”,
// --appendonly no); the host's redis-server service plays no part.
type Redis struct {
	// Addrs are the nodes' host:port, the first one a master.
	Addrs []string
	// CAFile is the CA that signed the server certificate (TLS only).
	CAFile string
	// ClientCert and ClientKey are a client certificate the CA signed and
	// its key (TLS with ClientAuth only).
	ClientCert, ClientKey string
	// SentinelAddr is the Sentinel's host:port (Sentinel only).
	SentinelAddr string
	opts         RedisOptions
	bin, cli     string
	nodes        []*redisNode
	tlsFiles     [5]string // cert, key, CA, client cert, client key
}

type redisNode struct {
	sentinel bool
	port     int
	dir      string
	mu       sync.Mutex
	cmd      *exec.Cmd
	out      *bytes.Buffer
	exit     chan struct{}
}

// RequireRedis returns the paths of redis-server and redis-cli. It skips
// tb when they are not installed, or fails it under TIERLIMIT_REQUIRE_BPF=1,
// where CI has installed them (provision.sh lists redis-server and
// redis-tools).
func RequireRedis(tb testing.TB) (server, cli string) {
	tb.Helper()
	server, err1 := exec.LookPath("redis-server")
	cli, err2 := exec.LookPath("redis-cli")
	if err1 == nil && err2 == nil {
		return server, cli
	}
	msg := "redis-server or redis-cli not installed (apt-get install redis-server redis-tools)"
	if os.Getenv(RequireEnv) == "1" {
		tb.Fatalf("%s; required under %s=1", msg, RequireEnv)
	}
	tb.Skip(msg)
	return "", ""
}

// StartRedis runs a redis-server (or a cluster of them) as opts says and
// waits until it answers. tb.Cleanup kills every node and waits for it.
func StartRedis(tb testing.TB, opts RedisOptions) *Redis {
	tb.Helper()
	r := &Redis{opts: opts}
	r.bin, r.cli = RequireRedis(tb)
	if opts.Sentinel && opts.Cluster > 0 {
		tb.Fatalf("StartRedis: a Sentinel with a cluster is not supported")
	}
	if (opts.Host != "" || opts.Port != 0) && (opts.Cluster > 0 || opts.NetNS != nil) {
		tb.Fatalf("StartRedis: Host and Port are for a standalone server")
	}
	if opts.NetNS != nil && (opts.Cluster > 0 || opts.Sentinel || opts.TLS || !opts.Addr.IsValid()) {
		tb.Fatalf("StartRedis: a server in a namespace is a plain standalone one on an address given")
	}
	if opts.Cluster > 0 && opts.Cluster < 3 {
		tb.Fatalf("StartRedis: a cluster needs at least 3 masters, not %d", opts.Cluster)
	}
	if opts.TLS {
		r.tlsFiles = WriteTLS(tb, tb.TempDir(), opts.CertDNS)
		r.CAFile = r.tlsFiles[2]
		if opts.ClientAuth {
			r.ClientCert, r.ClientKey = r.tlsFiles[3], r.tlsFiles[4]
		}
	}
	n := max(1, opts.Cluster)
	for i := 0; i < n; i++ {
		node := &redisNode{port: 6379, dir: tb.TempDir()}
		if opts.NetNS == nil {
			node.port = opts.Port
			if node.port == 0 {
				node.port = freePort(tb, opts.Cluster > 0)
			}
		}
		r.nodes = append(r.nodes, node)
		r.Addrs = append(r.Addrs, net.JoinHostPort(r.host(), strconv.Itoa(node.port)))
	}
	if opts.Sentinel {
		node := &redisNode{sentinel: true, port: freePort(tb, false), dir: tb.TempDir()}
		r.nodes = append(r.nodes, node)
		r.SentinelAddr = net.JoinHostPort("127.0.0.1", strconv.Itoa(node.port))
	}
	tb.Cleanup(func() {
		for _, node := range r.nodes {
			node.kill()
		}
	})
	for i := range r.nodes {
		r.start(tb, i)
	}
	if opts.Cluster > 0 {
		r.createCluster(tb)
	}
	return r
}

// host is the address the servers listen on: 127.0.0.1, or Addr in NetNS.
func (r *Redis) host() string {
	if r.opts.NetNS != nil {
		return r.opts.Addr.String()
	}
	if r.opts.Host != "" {
		return r.opts.Host
	}
	return "127.0.0.1"
}

// command runs name with args, inside NetNS when set.
func (r *Redis) command(name string, args ...string) *exec.Cmd {
	if r.opts.NetNS != nil {
		return exec.Command("nsenter", append([]string{"--net=" + r.opts.NetNS.Path, "--", name}, args...)...)
	}
	return exec.Command(name, args...)
}

// sentinelConfig writes the Sentinel's configuration file (it rewrites
// it as it runs) and returns its path.
func (r *Redis) sentinelConfig(tb testing.TB, n *redisNode) string {
	tb.Helper()
	conf := filepath.Join(n.dir, "sentinel.conf")
	host, port, _ := net.SplitHostPort(r.Addrs[0])
	cfg := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nsentinel monitor %s %s %s 1\nsentinel down-after-milliseconds %s 5000\n",
		n.port, n.dir, RedisMaster, host, port, RedisMaster)
	if r.opts.TLS {
		cfg = strings.Replace(cfg, fmt.Sprintf("port %d\n", n.port), fmt.Sprintf("port 0\ntls-port %d\n", n.port), 1)
		cfg += fmt.Sprintf("tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-replication yes\ntls-auth-clients %s\n",
			r.tlsFiles[0], r.tlsFiles[1], r.tlsFiles[2], yesNo(r.opts.ClientAuth))
	}
	if r.opts.Password != "" {
		cfg += fmt.Sprintf("sentinel auth-pass %s %s\n", RedisMaster, r.opts.Password)
	}
	if r.opts.SentinelPassword != "" {
		cfg += fmt.Sprintf("requirepass %s\n", r.opts.SentinelPassword)
	}
	if err := os.WriteFile(conf, []byte(cfg), 0o600); err != nil {
		tb.Fatal(err)
	}
	return conf
}

// URL returns the store URL that reaches r: redis://, rediss:// or
// redis+cluster:// (rediss+cluster:// for a TLS cluster).
func (r *Redis) URL() string {
	scheme := "redis"
	if r.opts.TLS {
		scheme = "rediss"
	}
	if r.opts.Cluster > 0 {
		return scheme + "+cluster://" + strings.Join(r.Addrs, ",")
	}
	if r.opts.Sentinel {
		return scheme + "+sentinel://" + r.SentinelAddr + "/" + RedisMaster
	}
	return scheme + "://" + r.Addrs[0]
}

// PID returns the process id of node i.
func (r *Redis) PID(i int) int {
	n := r.nodes[i]
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.cmd == nil {
		return 0
	}
	return n.cmd.Process.Pid
}

// KillNode kills node i (SIGKILL) and waits for it: with a Sentinel,
// node 0 is the master and the Sentinel stays.
func (r *Redis) KillNode(tb testing.TB, i int) {
	tb.Helper()
	r.nodes[i].kill()
}

// Kill kills every node (SIGKILL) and waits for it: the store is gone.
func (r *Redis) Kill(tb testing.TB) {
	tb.Helper()
	for _, n := range r.nodes {
		n.kill()
	}
}

// Restart starts every node again on its port, after Kill, and waits
// until each answers. A standalone server comes back empty.
func (r *Redis) Restart(tb testing.TB) {
	tb.Helper()
	for i := range r.nodes {
		r.start(tb, i)
	}
	if r.opts.Cluster > 0 {
		r.waitCluster(tb)
	}
}

// Signal sends sig (SIGSTOP, SIGCONT) to every node.
func (r *Redis) Signal(tb testing.TB, sig syscall.Signal) {
	tb.Helper()
	for i := range r.nodes {
		if pid := r.PID(i); pid > 0 {
			if err := syscall.Kill(pid, sig); err != nil {
				tb.Fatalf("signal %v to redis-server %d: %v", sig, pid, err)
			}
		}
	}
}

// CLI runs redis-cli against node i with args and returns its output.
func (r *Redis) CLI(tb testing.TB, i int, args ...string) string {
	tb.Helper()
	a := []string{"-h", r.host(), "-p", strconv.Itoa(r.nodes[i].port)}
	if r.opts.TLS {
		a = append(a, "--tls", "--cacert", r.CAFile)
		if r.opts.ClientAuth {
			a = append(a, "--cert", r.ClientCert, "--key", r.ClientKey)
		}
	}
	if r.nodes[i].sentinel {
		if r.opts.SentinelPassword != "" {
			a = append(a, "--no-auth-warning", "-a", r.opts.SentinelPassword)
		}
	} else if r.opts.Password != "" {
		a = append(a, "--no-auth-warning", "-a", r.opts.Password)
	}
	out, err := r.command(r.cli, append(a, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("redis-cli %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

func (r *Redis) args(n *redisNode) []string {
	a := []string{"--bind", r.host(), "--dir", n.dir, "--save", "", "--appendonly", "no",
		"--daemonize", "no", "--protected-mode", "no", "--logfile", "", "--databases", "1"}
	if r.opts.TLS {
		a = append(a, "--port", "0", "--tls-port", strconv.Itoa(n.port),
			"--tls-cert-file", r.tlsFiles[0], "--tls-key-file", r.tlsFiles[1],
			"--tls-ca-cert-file", r.tlsFiles[2], "--tls-auth-clients", yesNo(r.opts.ClientAuth))
		if r.opts.Cluster > 0 {
			a = append(a, "--tls-cluster", "yes")
		}
	} else {
		a = append(a, "--port", strconv.Itoa(n.port))
	}
	if r.opts.Password != "" {
		a = append(a, "--requirepass", r.opts.Password, "--masterauth", r.opts.Password)
	}
	if r.opts.Cluster > 0 {
		a = append(a, "--cluster-enabled", "yes", "--cluster-config-file", filepath.Join(n.dir, "nodes.conf"),
			"--cluster-node-timeout", "2000")
	}
	return a
}

func (r *Redis) start(tb testing.TB, i int) {
	tb.Helper()
	n := r.nodes[i]
	n.mu.Lock()
	n.out = &bytes.Buffer{}
	if n.sentinel {
		n.cmd = exec.Command(r.bin, r.sentinelConfig(tb, n), "--sentinel")
	} else {
		n.cmd = r.command(r.bin, r.args(n)...)
	}
	n.cmd.Stdout, n.cmd.Stderr = n.out, n.out
	// Pdeathsig: the server dies with the test binary even when a panic or
	// a timeout skips the cleanup. The kernel sends it when the starting
	// thread exits, so that thread stays locked until the server is gone.
	n.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	n.exit = make(chan struct{})
	cmd, exit := n.cmd, n.exit
	started := make(chan error)
	go func() {
		runtime.LockOSThread()
		err := cmd.Start()
		started <- err
		if err == nil {
			cmd.Wait()
		}
		close(exit)
	}()
	if err := <-started; err != nil {
		n.cmd = nil
		n.mu.Unlock()
		tb.Fatalf("start redis-server: %v", err)
	}
	n.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for !r.answers(n) {
		select {
		case <-exit:
			tb.Fatalf("redis-server exited at start: %s", n.output())
		default:
		}
		if time.Now().After(deadline) {
			tb.Fatalf("redis-server on port %d did not answer within 10s: %s", n.port, n.output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// answers reports whether n replies to PING (NOAUTH counts: it is up).
func (r *Redis) answers(n *redisNode) bool {
	addr := net.JoinHostPort(r.host(), strconv.Itoa(n.port))
	var c net.Conn
	var err error
	d := &net.Dialer{Timeout: time.Second}
	if r.opts.NetNS != nil {
		// A socket opened inside the namespace stays in it.
		err = r.opts.NetNS.Do(func() (err error) {
			c, err = d.Dial("tcp", addr)
			return err
		})
	} else if r.opts.TLS {
		pool := x509.NewCertPool()
		ca, _ := os.ReadFile(r.CAFile)
		pool.AppendCertsFromPEM(ca)
		cfg := &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}
		if r.opts.CertDNS != "" {
			cfg.ServerName = r.opts.CertDNS
		}
		if r.opts.ClientAuth {
			pair, err := tls.LoadX509KeyPair(r.ClientCert, r.ClientKey)
			if err != nil {
				return false
			}
			cfg.Certificates = []tls.Certificate{pair}
		}
		c, err = tls.DialWithDialer(d, "tcp", addr, cfg)
	} else {
		c, err = d.Dial("tcp", addr)
	}
	if err != nil {
		return false
	}
	return sandbox.RedisUp(c, true)
}

func (n *redisNode) output() string {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.out.String()
}

func (n *redisNode) kill() {
	n.mu.Lock()
	cmd, exit := n.cmd, n.exit
	n.cmd = nil
	n.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT) // a stopped process dies only once continued
	cmd.Process.Kill()
	<-exit
}

func (r *Redis) createCluster(tb testing.TB) {
	tb.Helper()
	a := []string{"--cluster", "create"}
	a = append(a, r.Addrs...)
	a = append(a, "--cluster-replicas", "0", "--cluster-yes")
	r.CLI(tb, 0, a...)
	r.waitCluster(tb)
}

// waitCluster waits until every node says cluster_state:ok.
func (r *Redis) waitCluster(tb testing.TB) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for i := range r.nodes {
		for !strings.Contains(r.CLI(tb, i, "cluster", "info"), "cluster_state:ok") {
			if time.Now().After(deadline) {
				tb.Fatalf("redis cluster node %s not ok within 20s: %s", r.Addrs[i], r.CLI(tb, i, "cluster", "info"))
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
}

// freePort returns a TCP port on 127.0.0.1 that was free a moment ago
// (and, for a cluster node, whose bus port, port + 10000, was too).
func freePort(tb testing.TB, cluster bool) int {
	tb.Helper()
	for range 100 {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatalf("find a free port: %v", err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		l.Close()
		if !cluster {
			return port
		}
		if port+10000 > 65535 {
			continue
		}
		bus, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port+10000)))
		if err == nil {
			bus.Close()
			return port
		}
	}
	tb.Fatalf("no free port pair for a cluster node")
	return 0
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

// WriteTLS writes a CA, a server certificate it signs, for 127.0.0.1 and
// localhost (for dnsName alone when set), and a client certificate it
// signs, into dir, and returns the cert, key, CA, client cert and client
// key paths.
func WriteTLS(tb testing.TB, dir, dnsName string) [5]string {
	tb.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "tierlimit test CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	ca, _ := x509.ParseCertificate(caDER)
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		DNSNames:     []string{"localhost"},
	}
	if dnsName != "" {
		tmpl.Subject.CommonName, tmpl.IPAddresses, tmpl.DNSNames = dnsName, nil, []string{dnsName}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		tb.Fatal(err)
	}
	clientKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	clientTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "tierlimit test client"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	clientDER, err := x509.CreateCertificate(rand.Reader, clientTmpl, ca, &clientKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	clientKeyDER, err := x509.MarshalECPrivateKey(clientKey)
	if err != nil {
		tb.Fatal(err)
	}
	files := [5]string{filepath.Join(dir, "server.crt"), filepath.Join(dir, "server.key"), filepath.Join(dir, "ca.crt"),
		filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")}
	for i, b := range []*pem.Block{{Type: "CERTIFICATE", Bytes: der}, {Type: "EC PRIVATE KEY", Bytes: keyDER}, {Type: "CERTIFICATE", Bytes: caDER},
		{Type: "CERTIFICATE", Bytes: clientDER}, {Type: "EC PRIVATE KEY", Bytes: clientKeyDER}} {
		if err := os.WriteFile(files[i], pem.EncodeToMemory(b), 0o600); err != nil {
			tb.Fatal(err)
		}
	}
	return files
}

// ProcCPU returns the user + system CPU time that process pid has used,
// from /proc/PID/stat.
func ProcCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc/%d/stat: no command", pid)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	utime, err1 := strconv.ParseInt(f[11], 10, 64)
	stime, err2 := strconv.ParseInt(f[12], 10, 64)
	if err1 != nil || err2 != nil {
		return 0, fmt.Errorf("/proc/%d/stat: bad times", pid)
	}
	const hz = 100 // USER_HZ, fixed at 100 on Linux for /proc
	return time.Duration(utime+stime) * time.Second / hz, nil
}
