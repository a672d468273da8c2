package testservice

import (
	"context"
	"crypto/rand"
	"crypto/rsa"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Kube is a real Kubernetes control plane for tests: etcd (Debian's, from
// INFERGATE_ETCD or PATH) and kube-apiserver (built by `make tools` into the
// tools cache, or INFERGATE_KUBE_APISERVER) on free loopback ports. There is
// no kubelet, scheduler or controller manager: tests write pod status
// themselves. The API server authenticates static tokens and authorizes
// with RBAC; AdminToken is in system:masters, UserToken (user
// infergate-tier1) has no permission until a test grants it.
type Kube struct {
	t          testing.TB
	bin        string
	dir        string
	port       int
	etcdURL    string
	AdminToken string
	UserToken  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
}

// KubeUser is the user name of Kube.UserToken.
const KubeUser = "infergate-tier1"

// StartKube starts etcd and kube-apiserver and waits until the API server
// is ready; both stop at test cleanup.
func StartKube(t testing.TB) *Kube {
	t.Helper()
	k := &Kube{
		t:          t,
		bin:        Binary(t, "INFERGATE_KUBE_APISERVER", "kube-apiserver"),
		dir:        t.TempDir(),
		port:       FreePort(t),
		AdminToken: randHex(t),
		UserToken:  randHex(t),
	}
	k.etcdURL = startEtcd(t, Binary(t, "INFERGATE_ETCD", "etcd"), k.dir)

	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatalf("testservice: service account key: %v", err)
	}
	pub, err := x509.MarshalPKIXPublicKey(&key.PublicKey)
	if err != nil {
		t.Fatalf("testservice: service account key: %v", err)
	}
	writeFile(t, filepath.Join(k.dir, "sa.key"), pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: x509.MarshalPKCS1PrivateKey(key)}))
	writeFile(t, filepath.Join(k.dir, "sa.pub"), pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}))
	writeFile(t, filepath.Join(k.dir, "tokens.csv"), fmt.Appendf(nil,
		"%s,admin,admin,system:masters\n%s,%s,%s\n", k.AdminToken, k.UserToken, KubeUser, KubeUser))
	t.Cleanup(k.Stop)
	k.Start()
	return k
}

// Host is the API server URL.
func (k *Kube) Host() string { return "https://127.0.0.1:" + strconv.Itoa(k.port) }

// CAFile holds the API server's self-signed serving certificate and its CA;
// it stays the same across Stop and Start.
func (k *Kube) CAFile() string { return filepath.Join(k.dir, "certs", "apiserver.crt") }

// CAData is the content of CAFile.
func (k *Kube) CAData() []byte {
	b, err := os.ReadFile(k.CAFile())
	if err != nil {
		k.t.Fatalf("testservice: kube CA: %v", err)
	}
	return b
}

// Kubeconfig writes a kubeconfig for token into the test's directory and
// returns its path.
func (k *Kube) Kubeconfig(token, namespace string) string {
	path := filepath.Join(k.dir, "kubeconfig-"+token[:8])
	cfg := fmt.Sprintf(`apiVersion: v1
kind: Config
clusters:
- name: test
  cluster: {server: %q, certificate-authority-data: %s}
users:
- name: test
  user: {token: %q}
contexts:
- name: test
  context: {cluster: test, user: test, namespace: %q}
current-context: test
`, k.Host(), base64.StdEncoding.EncodeToString(k.CAData()), token, namespace)
	writeFile(k.t, path, []byte(cfg))
	return path
}

// Start starts kube-apiserver on the same port and certificates as before
// and waits until it is ready. It is a no-op while it runs.
func (k *Kube) Start() {
	k.t.Helper()
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.cmd != nil {
		return
	}
	args := []string{
		"--etcd-servers=" + k.etcdURL,
		"--bind-address=127.0.0.1",
		"--advertise-address=127.0.0.1",
		// No kubernetes Service endpoints: loopback is not allowed there.
		"--endpoint-reconciler-type=none",
		"--secure-port=" + strconv.Itoa(k.port),
		"--cert-dir=" + filepath.Join(k.dir, "certs"),
		"--token-auth-file=" + filepath.Join(k.dir, "tokens.csv"),
		"--authorization-mode=RBAC",
		"--service-account-issuer=https://kubernetes.default.svc",
		"--service-account-key-file=" + filepath.Join(k.dir, "sa.pub"),
		"--service-account-signing-key-file=" + filepath.Join(k.dir, "sa.key"),
		"--service-cluster-ip-range=10.0.0.0/24",
		// No controller manager creates default service accounts.
		"--disable-admission-plugins=ServiceAccount",
		"--anonymous-auth=false",
		"--v=0",
	}
	logPath := filepath.Join(k.dir, "kube-apiserver.log")
	cmd, done, err := startLogged(k.bin, args, logPath)
	if err != nil {
		k.t.Fatalf("testservice: kube-apiserver: %v", err)
	}
	k.cmd, k.done = cmd, done
	if err := k.waitReady(done, 90*time.Second); err != nil {
		k.stopLocked()
		log, _ := os.ReadFile(logPath)
		k.t.Fatalf("testservice: kube-apiserver did not become ready: %v\n%s", err, tail(log, 6000))
	}
}

// Stop stops kube-apiserver (etcd keeps running). It is a no-op when it is
// not running.
func (k *Kube) Stop() {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopLocked()
}

func (k *Kube) stopLocked() {
	if k.cmd == nil {
		return
	}
	terminate(k.cmd, k.done, 15*time.Second)
	k.cmd, k.done = nil, nil
}

// waitReady polls /readyz with the admin token until it answers 200.
func (k *Kube) waitReady(exited <-chan struct{}, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	var client *http.Client
	for {
		if client == nil {
			// The certificates exist once the server has generated them.
			if ca, err := os.ReadFile(k.CAFile()); err == nil {
				pool := x509.NewCertPool()
				if pool.AppendCertsFromPEM(ca) {
					client = &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
						TLSClientConfig: &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12},
					}}
				}
			}
		}
		if client != nil {
			req, _ := http.NewRequestWithContext(ctx, http.MethodGet, k.Host()+"/readyz", nil)
			req.Header.Set("Authorization", "Bearer "+k.AdminToken)
			if resp, err := client.Do(req); err == nil {
				resp.Body.Close()
				if resp.StatusCode == http.StatusOK {
					return nil
				}
			}
		}
		select {
		case <-exited:
			return fmt.Errorf("kube-apiserver exited")
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// startEtcd starts a single-member etcd on free loopback ports with its data
// in dir, stopped at cleanup, and returns its client URL.
func startEtcd(t testing.TB, bin, dir string) string {
	t.Helper()
	client := "http://127.0.0.1:" + strconv.Itoa(FreePort(t))
	peer := "http://127.0.0.1:" + strconv.Itoa(FreePort(t))
	logPath := filepath.Join(dir, "etcd.log")
	cmd, done, err := startLogged(bin, []string{
		"--name=test", "--data-dir=" + filepath.Join(dir, "etcd"),
		"--listen-client-urls=" + client, "--advertise-client-urls=" + client,
		"--listen-peer-urls=" + peer, "--initial-advertise-peer-urls=" + peer,
		"--initial-cluster=test=" + peer, "--logger=zap", "--log-level=warn",
	}, logPath)
	if err != nil {
		t.Fatalf("testservice: etcd: %v", err)
	}
	t.Cleanup(func() { terminate(cmd, done, 10*time.Second) })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for !get(ctx, client+"/health", "", func(b []byte) bool { return len(b) > 0 }) {
		select {
		case <-done:
			log, _ := os.ReadFile(logPath)
			t.Fatalf("testservice: etcd exited\n%s", tail(log, 4000))
		case <-ctx.Done():
			log, _ := os.ReadFile(logPath)
			t.Fatalf("testservice: etcd did not become healthy\n%s", tail(log, 4000))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return client
}

func writeFile(t testing.TB, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatalf("testservice: %v", err)
	}
}

func randHex(t testing.TB) string {
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("testservice: random: %v", err)
	}
	return hex.EncodeToString(b)
}
