package testservice_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/infergate/infergate/shared/testservice"
)

func TestConsulStopStart(t *testing.T) {
	c := testservice.StartConsul(t)
	leader := func() (string, error) {
		resp, err := http.Get("http://" + c.Addr() + "/v1/status/leader")
		if err != nil {
			return "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}
	if l, err := leader(); err != nil || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("leader = %q, %v", l, err)
	}
	if !strings.HasPrefix(c.Addr(), "127.0.0.1:") {
		t.Fatalf("Addr = %s, want loopback", c.Addr())
	}
	c.Stop()
	if _, err := leader(); err == nil {
		t.Fatal("agent still answers after Stop")
	}
	c.Start() // same ports
	if l, err := leader(); err != nil || !strings.Contains(l, "127.0.0.1:") {
		t.Fatalf("after restart: leader = %q, %v", l, err)
	}
}
