// kube-apiserver for Rivora's tests: the upstream command, linked from
// k8s.io/kubernetes as a library so the build needs only the Go module proxy
// (no Kubernetes checkout, no release download).
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
