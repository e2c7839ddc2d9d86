// Command pause is the pod sandbox process of the e2e real node (e2e/node.py), in a FROM-scratch image built
// there, so the node needs no registry: it waits for SIGINT or SIGTERM, then exits 0, and reaps children (a pod
// sharing its PID namespace makes it PID 1), as upstream's pause does.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for received := range signals {
		if received != syscall.SIGCHLD {
			os.Exit(0)
		}
		for {
			pid, err := syscall.Wait4(-1, nil, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
}
