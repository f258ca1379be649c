package fleet

import (
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/tierlimit/tierlimit/internal/testenv"
)

// TestAlertConnReset reproduces the landing's failure of
// TestFleetCertificateRotation: a TLS 1.3 server refuses the client's
// certificate after the client's handshake is done, alerts and closes
// with a reset before the client's first write. A plain TLS client's write
// meets the reset (ECONNRESET, no refusal); alertConn's names the alert,
// which refusal reads as a refusal of the credentials. A reset with no
// alert before it stays what it was.
func TestAlertConnReset(t *testing.T) {
	good := testenv.WriteTLS(t, t.TempDir(), "")
	other := testenv.WriteTLS(t, t.TempDir(), "")
	for _, tc := range []struct {
		name    string
		client  [5]string // whose client certificate
		wrap    bool
		refused bool
	}{
		{"plain, another CA's certificate", other, false, false},
		{"alertConn, another CA's certificate", other, true, true},
		{"alertConn, a reset without alert", good, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := writeAfterReset(t, good, tc.client, tc.wrap)
			if !errors.Is(err, syscall.ECONNRESET) {
				t.Fatalf("write after the server's reset: %v; want ECONNRESET (the case is not reproduced)", err)
			}
			if got := isAuth(refusal(err)); got != tc.refused {
				t.Errorf("write after the server's reset: %v; a refusal %v, want %v", err, got, tc.refused)
			}
		})
	}
}

// writeAfterReset dials a TLS 1.3 server holding server's certificate and
// CA, as a client presenting client's certificate, waits until the server
// has finished its handshake (refused or not) and closed with a reset,
// and returns the client's first write's error.
func writeAfterReset(t *testing.T, server, client [5]string, wrap bool) error {
	// The files are read as the dialer reads them (tlsConfig): the
	// client's configuration is the agent's; the server's takes the
	// certificate and the CA pool of one built from its files.
	srv, err := tlsConfig(Config{CAFile: server[2], CertFile: server[0], KeyFile: server[1]}, "")
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tlsConfig(Config{CAFile: server[2], CertFile: client[3], KeyFile: client[4]}, "127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srvCfg := &tls.Config{MinVersion: tls.VersionTLS13, Certificates: srv.Certificates,
		ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: srv.RootCAs}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	closed := make(chan error, 1)
	go func() {
		raw, err := ln.Accept()
		if err != nil {
			closed <- err
			return
		}
		s := tls.Server(raw, srvCfg)
		s.SetDeadline(time.Now().Add(10 * time.Second))
		herr := s.Handshake()
		raw.(*net.TCPConn).SetLinger(0) // close with a reset
		raw.Close()
		closed <- herr
	}()
	raw, err := net.DialTimeout("tcp", ln.Addr().String(), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	c := tls.Client(raw, cli)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if err := c.Handshake(); err != nil {
		t.Fatalf("client handshake: %v", err)
	}
	if v := c.ConnectionState().Version; v != tls.VersionTLS13 {
		t.Fatalf("client handshake: TLS version %#x, want 1.3", v)
	}
	select {
	case herr := <-closed:
		t.Logf("server's handshake: %v", herr)
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not close in 10 s")
	}
	time.Sleep(20 * time.Millisecond) // the reset crosses loopback
	var conn net.Conn = c
	if wrap {
		conn = alertConn{c}
	}
	_, err = conn.Write([]byte("*1\r\n$4\r\nPING\r\n"))
	return err
}
