package testservice

import (
	"fmt"
	"os"
	"os/exec"
	"syscall"
	"time"
)

// startLogged starts bin with args in its own process group, its output
// appended to logPath; done is closed (and the log closed) once it exits.
func startLogged(bin string, args []string, logPath string) (*exec.Cmd, chan struct{}, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, nil, fmt.Errorf("log: %w", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = logf.Close() // nothing was written; the start error is the one to return
		return nil, nil, fmt.Errorf("start: %w", err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		_ = logf.Close() // the process's log: a lost tail only shortens what a failing test prints
		close(done)
	}()
	return cmd, done, nil
}

// terminate asks cmd to stop with SIGTERM and kills it after grace; done
// is closed when the process has exited.
func terminate(cmd *exec.Cmd, done <-chan struct{}, grace time.Duration) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-done:
	case <-time.After(grace):
		_ = cmd.Process.Kill()
		<-done
	}
}
