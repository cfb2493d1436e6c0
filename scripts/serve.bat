@echo off
rem Serve a model in the foreground (no tray; Ctrl-C stops).
rem   scripts\serve.bat [PORT] [CTX]
rem Environment overrides (the arguments win over OPENJET_PORT / OPENJET_CTX):
rem   OPENJET_MODEL    a GGUF path, a Hugging Face REPO/FILE (downloaded first), or demo (the tiny CPU model)
rem                    (default: unsloth/Qwen3.8-27B-GGUF/Qwen3.8-27B-Q4_K_M.gguf, downloaded on first use)
rem   OPENJET_PORT     port (default 8080)
rem   OPENJET_CTX      context length in tokens (default: the server's)
rem   OPENJET_HOST     address to listen on (default 127.0.0.1)
rem   OPENJET_API_KEY  key clients must send (read by the server itself)
rem   OPENJET_ENGINE   reference or cuda (default: reference for demo, cuda otherwise)
setlocal EnableExtensions

set "PORT=%~1"
if "%PORT%"=="" set "PORT=%OPENJET_PORT%"
if "%PORT%"=="" set "PORT=8080"
set "CTX=%~2"
if "%CTX%"=="" set "CTX=%OPENJET_CTX%"
set "HOST=%OPENJET_HOST%"
if "%HOST%"=="" set "HOST=127.0.0.1"
set "LAUNCH=python -m openjet_launcher"
where openjet-launch >nul 2>nul && set "LAUNCH=openjet-launch"
set "MODEL=%OPENJET_MODEL%"
if /I "%MODEL%"=="demo" goto have_model
if not "%MODEL%"=="" if exist "%MODEL%" goto have_model
rem the default model or REPO/FILE: download (resumes) and take the first path it prints
set "GOT="
for /f "usebackq delims=" %%P in (`%LAUNCH% download %MODEL%`) do if not defined GOT set "GOT=%%P"
if not defined GOT (echo serve.bat: the download did not give a model path 1>&2 & exit /b 1)
set "MODEL=%GOT%"
:have_model
set "ENGINE=%OPENJET_ENGINE%"
if "%ENGINE%"=="" (
  if /I "%MODEL%"=="demo" (set "ENGINE=reference") else (set "ENGINE=cuda")
)
set "CTXARG="
if not "%CTX%"=="" set "CTXARG=--ctx %CTX%"

set "CLIENTHOST=%HOST%"
if "%HOST%"=="0.0.0.0" set "CLIENTHOST=127.0.0.1"
set "BASE=http://%CLIENTHOST%:%PORT%/v1"
set "KEYNOTE=none"
if defined OPENJET_API_KEY set "KEYNOTE=the value of OPENJET_API_KEY"

echo OpenJet: serving %MODEL% on %ENGINE% at %HOST%:%PORT% 1>&2
echo   base URL     %BASE% 1>&2
echo   Open WebUI   Admin Panel ^> Settings ^> Connections ^> OpenAI API: URL %BASE%, key %KEYNOTE% 1>&2
echo   more clients docs\CLIENTS.md 1>&2

%LAUNCH% serve "%MODEL%" --engine %ENGINE% --host %HOST% --port %PORT% %CTXARG%
exit /b %ERRORLEVEL%
