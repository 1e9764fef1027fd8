// kube-apiserver for Rivora's tests: the upstream command, linked from
// k8s.io/kubernetes as a library so the build needs only the Go module proxy
// (no Kubernetes checkout, no release download). scripts/apiserver.sh
// builds it. To move to another release, change k8s.io/kubernetes's version
// and every replace's tag (v0.X.Y for v1.X.Y) in go.mod, add a replace for
// any staging module the new k8s.io/kubernetes requires at v0.0.0, then
// go mod tidy.
package main

import (
	"os"

	"k8s.io/component-base/cli"
	"k8s.io/kubernetes/cmd/kube-apiserver/app"
)

func main() { os.Exit(cli.Run(app.NewAPIServerCommand())) }
