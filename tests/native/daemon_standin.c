/* A daemon stand-in as a real executable, as NVIDIA's daemons are: /proc/PID/exe of the
   process is this file (the agent checks it before it adopts or signals a daemon), and its
   sha256 is the file's. The behaviour is tests/native/daemon_run.py's `main`, run by the
   Python interpreter embedded here (linked to libpython; -I: no environment, no user site).

   Built by tests/native/daemons.py with STANDIN_NAME, STANDIN_VERSION and TESTS_DIR; what
   each daemon does, and the sources it follows (NVIDIA/nvidia-persistenced at
   410f35493c277b5767877b65bb011f7f66a60ed1), is said there. */
#include <Python.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv) {
    static char code[4096];
    snprintf(code, sizeof code,
             "import sys\nsys.path.insert(0, %s)\nfrom native.daemon_run import main\n"
             "sys.exit(main(%s, %s, sys.argv[1:]))\n",
             TESTS_DIR, STANDIN_NAME, STANDIN_VERSION);
    char **args = calloc((size_t)argc + 4, sizeof(char *));
    if (args == NULL)
        return 2;
    args[0] = argv[0];
    args[1] = "-I";
    args[2] = "-c";
    args[3] = code;
    for (int i = 1; i < argc; i++)
        args[i + 3] = argv[i];
    return Py_BytesMain(argc + 3, args);
}
