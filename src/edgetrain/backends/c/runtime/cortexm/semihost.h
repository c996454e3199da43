/* Arm semihosting (the subset a training firmware needs): console output and exit with a
 * status. QEMU implements it with `-semihosting-config enable=on,target=native`. */
#ifndef ET_SEMIHOST_H
#define ET_SEMIHOST_H

/* Writes a NUL-terminated string to the host's standard output (SYS_WRITE to ":tt"). */
void et_semihost_puts(const char *s);
/* Ends the program with `status` (0: ADP_Stopped_ApplicationExit through SYS_EXIT; other
 * values through SYS_EXIT_EXTENDED so that QEMU exits with that status). Never returns. */
void et_semihost_exit(int status) __attribute__((noreturn));

#endif
