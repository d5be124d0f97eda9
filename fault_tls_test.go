package remutex

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/remutex/remutex/internal/redistest"
)

// faultCA is a certificate authority made for one test.
type faultCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
	pem  []byte
}

func newFaultCA(t testing.TB, name string) *faultCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	ca := &faultCA{cert: cert, key: key, pool: x509.NewCertPool(), pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
	ca.pool.AddCert(cert)
	return ca
}

// issue returns PEM certificate and key for a server on 127.0.0.1.
func (ca *faultCA) issue(t testing.TB) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

// startFaultTLSServer starts a redis-server that speaks only TLS (no
// plain-text port), with a certificate from ca, and returns its address.
// It is killed at the end of the test.
func startFaultTLSServer(t testing.TB, ca *faultCA) string {
	t.Helper()
	dir := t.TempDir()
	certPEM, keyPEM := ca.issue(t)
	files := map[string][]byte{"ca.crt": ca.pem, "server.crt": certPEM, "server.key": keyPEM}
	for name, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	srv := redistest.StartTLS(t, &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12},
		"--tls-cert-file", filepath.Join(dir, "server.crt"),
		"--tls-key-file", filepath.Join(dir, "server.key"),
		"--tls-ca-cert-file", filepath.Join(dir, "ca.crt"),
		"--tls-auth-clients", "no")
	return srv.Addr()
}

// TestFaultTLS: on a TLS-only redis-server, locking, renewal and wake-ups
// work; a client that trusts another CA gets an error at once, not a hang.
func TestFaultTLS(t *testing.T) {
	// Serial: PTTL, read after a renewal, must still be above 2/3 of a 1s lease.
	ca := newFaultCA(t, "remutex test CA")
	addr := startFaultTLSServer(t, ca)
	opts := func(pool *x509.CertPool) *redis.Options {
		return &redis.Options{Addr: addr, TLSConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}}
	}
	ctx := context.Background()
	name := lockName(t)
	k := keysOf(name)
	direct := newRDB(t, opts(ca.pool))

	plain := newRDB(t, &redis.Options{Addr: addr, MaxRetries: -1, ReadTimeout: 500 * time.Millisecond})
	if err := plain.Ping(ctx).Err(); err == nil {
		t.Fatal("a plain-text PING succeeded: the server is not TLS-only")
	}

	cmds := newCommandLog()
	hrdb := newRDB(t, opts(ca.pool))
	hrdb.AddHook(cmds)
	hc, herrs := clientWithErrors(t, hrdb)
	hm := hc.NewMutex(name, WithLease(faultLease), WithFencing())
	hg := newFaultGoroutine(t)
	reg := redistest.NewRegister(t)
	d, h := faultLockAndWrite(hg, testCtx(t, 10*time.Second), hm, reg, "holder")
	faultAwait(t, d, 5*time.Second, "lock over TLS")
	if h.err != nil || !h.wrote || h.fence == 0 {
		t.Fatalf("holder over TLS: LockContext %v, fence %d, write %v %v", h.err, h.fence, h.wrote, h.werr)
	}
	locked := time.Now()
	cmds.await(t, locked, faultLease, "a renewal over TLS", func(c loggedCommand) bool {
		return len(c.args) > 1 && c.err == nil &&
			(c.args[0] == "evalsha" && c.args[1] == renewScript.Hash() || c.args[0] == "eval" && c.args[1] == renewScript.Src)
	})
	if pttl, err := direct.Do(ctx, "pttl", k.hash).Int64(); err != nil || pttl <= (faultLease*2/3).Milliseconds() {
		t.Errorf("PTTL after a renewal: %d ms (%v), want about the lease", pttl, err)
	}

	wc, werrs := clientWithErrors(t, newRDB(t, opts(ca.pool)))
	wm := wc.NewMutex(name, WithLease(faultLease), WithFencing())
	wg := newFaultGoroutine(t)
	wdone, w := faultLockAndWrite(wg, testCtx(t, 10*time.Second), wm, reg, "waiter")
	faultSubscribed(t, direct, k.channel) // the waiter's subscription, over TLS
	observer := direct.Subscribe(ctx, k.channel+wc.id)
	defer observer.Close()
	if _, err := observer.Receive(testCtx(t, 5*time.Second)); err != nil {
		t.Fatalf("observer's subscription: %v", err)
	}
	if err := faultUnlock(t, hg, hm); err != nil {
		t.Fatalf("holder: UnlockContext over TLS: %v", err)
	}
	released := time.Now()
	faultAwait(t, wdone, 2*faultLease, "the waiter over TLS")
	if w.err != nil || !w.wrote || w.fence <= h.fence {
		t.Fatalf("waiter over TLS: LockContext %v, fence %d (holder's %d), write %v %v", w.err, w.fence, h.fence, w.wrote, w.werr)
	}
	t.Logf("waiter woke %v after the release", w.at.Sub(released))
	msg, err := observer.ReceiveMessage(testCtx(t, 5*time.Second))
	if err != nil {
		t.Fatalf("no release message over TLS: %v", err)
	}
	if msg.Payload != "r" && !strings.HasPrefix(msg.Payload, "g ") {
		t.Errorf("release message %q", msg.Payload)
	}
	if err := faultUnlock(t, wg, wm); err != nil {
		t.Errorf("waiter: UnlockContext over TLS: %v", err)
	}

	other := newFaultCA(t, "another CA")
	bc, _ := clientWithErrors(t, newRDB(t, opts(other.pool)))
	bm := bc.NewMutex(name, WithLease(faultLease))
	bg := newFaultGoroutine(t)
	var (
		lockErr, tryErr error
		took            time.Duration
	)
	bg.do(t, 10*time.Second, "locking with the wrong CA", func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		start := time.Now()
		lockErr = bm.LockContext(ctx)
		took = time.Since(start)
		_, tryErr = bm.TryLockContext(ctx)
	})
	var verr *tls.CertificateVerificationError
	if !errors.As(lockErr, &verr) {
		t.Errorf("LockContext with the wrong CA: %v, want the certificate verification error", lockErr)
	}
	if took > 2*time.Second {
		t.Errorf("LockContext with the wrong CA took %v, want an error at once", took)
	}
	if !errors.As(tryErr, &verr) {
		t.Errorf("TryLockContext with the wrong CA: %v, want the certificate verification error", tryErr)
	}
	if herrs.count(ErrLockLost)+werrs.count(ErrLockLost) != 0 {
		t.Errorf("losses reported: %v %v", herrs, werrs)
	}
}
